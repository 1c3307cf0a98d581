// Command checkout is a small net/http service that shows how to wire the stock library into
// checkout code: hold the stock, take the payment, confirm, or cancel when the payment is
// declined, all idempotent in the client's Idempotency-Key.
//
//	go run ./examples/checkout                          # embedded Redis (miniredis), :8080
//	go run ./examples/checkout -redis 127.0.0.1:6379    # a real Redis
//	go run ./examples/checkout -load sneaker-42=3 -decline mallory -hold-ttl 30s
//
//	curl -i -X POST localhost:8080/checkout -H 'Content-Type: application/json' \
//	     -H 'Idempotency-Key: order-1' -d '{"sku":"sneaker-42","qty":1,"user":"alice"}'
//	curl -i localhost:8080/stock/sneaker-42
//
// POST /checkout takes one JSON object {"sku", "qty", "user"} (Content-Type application/json,
// at most 64 KiB, nothing after the object) and a required Idempotency-Key header: 1 to 128
// visible ASCII characters, unique per order of a user and the same on every retry of it. The
// key is scoped to the user: two users who send the same key place two separate orders, and one
// user's key can never answer, charge or cancel another user's order. Its first use binds the
// key, in Redis, to its purchase (the sku and the qty) for -key-ttl (24h, the stock library's
// default ledger retention): every instance of the service shares the binding and a restart
// keeps it, so within that time the key answers only for that purchase, on any instance, and
// another sku or qty is refused (422) before anything is held or charged. A key whose every
// attempt was refused without taking stock (sold out, insufficient, user limit, no such item,
// closed) is free again at once. The order id (the stock library's request id, the payment's
// idempotency key) is derived from the user, the key, the sku and the qty, so a payment is
// never reused for another purchase, not even after -key-ttl, when the key may name a new one.
// The handler holds the stock for -hold-ttl, charges the (fake) payment service, and confirms
// the hold; a declined payment cancels it. A retry with the same key and user answers what the
// first attempt answered (200 with the same body, or the same error); one that finds the first
// attempt still paying, or dead while paying, finishes it. A retry of a key used before is
// marked as one for the stock library (stock.Request.Retry): if it is refused for stock, the
// refusal is recorded, and an earlier attempt that reaches Redis late (after a 503) is refused
// too, so "sold out" stays the answer for that key. Answers:
//
//	200  confirmed: {"order", "sku", "user", "qty", "status": "confirmed", "remaining"}
//	400  missing_idempotency_key, invalid (not one JSON object, data after it, an unknown
//	     field, a missing or malformed sku, qty or user, a malformed Idempotency-Key)
//	402  payment_declined: the hold was cancelled, the stock is back
//	403  user_limit: over -user-limit units of the item per user (a policy refusal, not a rate limit)
//	404  not_found: no such item, or no such endpoint
//	405  method_not_allowed, with Allow
//	409  sold_out, insufficient, closed (the item is closed for sale), refused or cancelled (the
//	     order was given back after it was confirmed)
//	410  hold_expired: the payment outlasted the hold; the stock went back and the payment was refunded
//	413  too_large: the body is over 64 KiB
//	415  unsupported_media_type: a Content-Type other than JSON (none at all is taken as JSON)
//	422  idempotency_key_reused: the user used the key with another sku or qty (within -key-ttl)
//	503  unavailable, with Retry-After: Redis or the payment service did not answer, the outcome
//	     is unknown; or the stock service cannot take orders now (fenced after a Redis failover,
//	     a write not yet replicated, shutting down, a Redis that may evict keys); retry with the
//	     same Idempotency-Key
//
// Every error the handler answers, whatever the status, has the body {"error": code,
// "message": text}. A few requests never reach the handler: net/http refuses them while
// reading them, with a text/plain body of its own (none for 417), and closes the connection:
// a malformed request line or header (a control character in a header value, a missing or
// malformed Host) 400, headers over 1 MiB (http.DefaultMaxHeaderBytes) 431, an Expect other
// than 100-continue 417, an unknown Transfer-Encoding 501, an HTTP version it does not speak
// 505. http.Server has no hook to change those answers. Nothing was held, charged or logged
// for them; the same request gets the same answer, so fix it rather than retry.
//
// GET /stock/{sku} returns the item's levels: {"sku", "available", "held", "sold", "loaded",
// "closed"}. Every request that reaches the handler is logged (log/slog, on stderr): method,
// path, status, duration, Idempotency-Key.
//
// Reserver.Run does the background work in one goroutine: a relay drains the outbox into an
// in-memory database of record (memstore; use sqlstore in a real service), a reconciler checks
// Redis against it, and a sweeper releases expired holds. SIGINT or SIGTERM stops the server
// gracefully: no new connections, in-flight checkouts finish (up to -shutdown-timeout), then
// the relay delivers what is left.
//
// Flags: -addr (:8080), -redis (host:port, or redis://user:password@host:port, rediss:// for
// TLS; default an embedded miniredis), -prefix (checkout: the stock library's keys are
// "<prefix>:...", the key bindings "<prefix>|key:..."), -hold-ttl (10m), -key-ttl (24h, at
// least -hold-ttl plus 30s), -user-limit (2), -load (sneaker-42=10,tee-7=100: items to load at
// start; an item that is already live is kept as it is), -decline (users whose payments are
// declined), -pay-delay (0: how long a payment takes), -shutdown-timeout (10s).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redisaddr"
	"github.com/stockres/stock/memstore"
)

func main() {
	flag.CommandLine.Init("checkout", flag.ExitOnError) // usage says "checkout", not go run's temporary path
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), "checkout serves a demo checkout API (POST /checkout, GET /stock/{sku}) on the stock library.\n\nUsage: checkout [flags]\n\nFlags:\n")
		flag.PrintDefaults()
	}
	addr := flag.String("addr", ":8080", "listen `address`")
	redisAddr := flag.String("redis", "", "a real Redis: host:port, or redis://user:password@host:port (rediss:// for TLS) (default: an embedded miniredis)")
	prefix := flag.String("prefix", "checkout", "Redis key prefix")
	holdTTL := flag.Duration("hold-ttl", 10*time.Minute, "how long a hold waits for its payment")
	keyTTL := flag.Duration("key-ttl", 24*time.Hour, "how long an Idempotency-Key stays bound to its purchase after its first use (at least -hold-ttl plus 30s)")
	userLimit := flag.Int64("user-limit", 2, "most units of one item per user (0: no limit)")
	load := flag.String("load", "sneaker-42=10,tee-7=100", "items to load at start: `sku=qty,...`")
	decline := flag.String("decline", "", "comma-separated `users` whose payments are declined")
	payDelay := flag.Duration("pay-delay", 0, "how long a payment takes")
	shutdownTimeout := flag.Duration("shutdown-timeout", 10*time.Second, "how long in-flight requests may take to finish at shutdown")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	slog.SetDefault(log)
	if err := serve(*addr, *redisAddr, *prefix, *holdTTL, *keyTTL, *userLimit, *load, *decline, *payDelay, *shutdownTimeout, log); err != nil {
		log.Error("checkout", "err", err)
		os.Exit(1)
	}
}

func serve(addr, redisAddr, prefix string, holdTTL, keyTTL time.Duration, userLimit int64, load, decline string,
	payDelay, shutdownTimeout time.Duration, log *slog.Logger) error {
	if keyTTL < holdTTL+flowTimeout {
		// A retry while the order may still be held or paying must find the key's record.
		return fmt.Errorf("-key-ttl %v is shorter than -hold-ttl %v plus %v", keyTTL, holdTTL, flowTimeout)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var opt rueidis.ClientOption
	if redisAddr != "" {
		o, err := redisaddr.Parse(redisAddr)
		if err != nil {
			return fmt.Errorf("-redis %v", err)
		}
		o.ForceSingleClient = len(o.InitAddress) == 1
		opt = o
	} else {
		m := miniredis.NewMiniRedis()
		if err := m.Start(); err != nil {
			return err
		}
		defer m.Close()
		m.ClockTTL(true) // key TTLs (the relay's lease) on the wall clock, as on a real server
		opt = rueidis.ClientOption{InitAddress: []string{m.Addr()}, DisableCache: true}
	}
	client, err := rueidis.NewClient(opt)
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	defer client.Close()
	r, err := stock.New(client, stock.WithPrefix(prefix), stock.WithUserLimit(userLimit), stock.WithLogger(log))
	if err != nil {
		return err
	}
	// The Idempotency-Key records, "<prefix>|key:...": beside the library's keys, never among them.
	keys, err := NewKeys(client, prefix, keyTTL)
	if err != nil {
		return err
	}

	db := memstore.New() // the database of record: sqlstore.New(db, sqlstore.Postgres) in a real service
	for item := range strings.SplitSeq(load, ",") {
		if item == "" {
			continue
		}
		sku, n, ok := strings.Cut(item, "=")
		qty, err := strconv.ParseInt(n, 10, 64)
		if !ok || err != nil {
			return fmt.Errorf("-load %q: want sku=qty", item)
		}
		// The database of record first, then Redis. An item already live in Redis is kept.
		if err := db.Load(ctx, sku, qty); err != nil {
			return err
		}
		if err := r.Load(ctx, sku, qty); errors.Is(err, stock.ErrLoaded) {
			log.Info("item already live; kept as it is", "sku", sku)
		} else if err != nil {
			return err
		}
	}

	pay := NewFakePayments()
	pay.Delay = payDelay
	for u := range strings.SplitSeq(decline, ",") {
		if u != "" {
			pay.Decline(u)
		}
	}

	// The background work (relay, reconciler, sweeper, cart recovery, failover guard) in one
	// goroutine; when bg ends, Run delivers what is left in the outbox and returns.
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { r.Run(bg, stock.RunOptions{Store: db}) })

	srv := &http.Server{
		Addr:              addr,
		Handler:           NewHandler(r, keys, pay, holdTTL, log),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      flowTimeout + 5*time.Second,
		IdleTimeout:       time.Minute,
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		stopBG()
		wg.Wait()
		return err
	}
	log.Info("checkout listening", "addr", ln.Addr().String(), "redis", orDefault(redisaddr.Redact(redisAddr), "embedded miniredis"), "hold_ttl", holdTTL)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	select {
	case err = <-served: // the listener failed
	case <-ctx.Done():
		log.Info("shutting down: finishing in-flight requests", "timeout", shutdownTimeout)
		sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		err = srv.Shutdown(sctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			log.Warn("shutdown timed out; closing the remaining connections")
			srv.Close()
		}
		err = nil
	}

	// The HTTP side is quiet: stop the background work, which delivers what is left.
	stopBG()
	wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	if err == nil {
		log.Info("stopped")
	}
	return err
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
