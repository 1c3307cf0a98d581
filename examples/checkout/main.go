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
// The start-up and shutdown follow the README's path. The Reserver refuses a take without a
// user (stock.WithUserRequired), so that an empty user cannot slip past -user-limit. Each -load
// item is put on sale with stockops.Preheat: in the database of record first, then in Redis
// with the stock the database holds. The database of record is in memory (memstore), so that
// the example runs with nothing but Go and forgets its sales when it stops; a real service
// uses sqlstore there, the rest unchanged (see the comment in serve, and the README's "The
// background work: Run"). Reserver.Run does the background work in one goroutine, with its
// options checked first (RunOptions.Validate) and its error read: a relay delivers the sales
// to the store, a reconciler checks Redis against it, a failover guard fences sales after a
// Redis failover until a reconcile pass ran, and a sweeper releases expired holds. The server
// listens only once Reserver.Ready says sales are taken (at once on a new deployment), and
// stops if Run stops on its own (an error at its start, such as a Redis whose
// maxmemory-policy can evict keys). SIGINT or SIGTERM stops it gracefully: no new
// connections, in-flight checkouts finish (up to -shutdown-timeout), then Reserver.Close stops
// Run, which delivers what is left in the outbox, and waits for it: after it nothing is
// written to Redis.
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
	"syscall"
	"time"

	"github.com/redis/rueidis"

	"github.com/stockres/stock"
	"github.com/stockres/stock/examples/internal/embedredis"
	"github.com/stockres/stock/internal/redisaddr"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

func main() {
	flag.CommandLine.Init("checkout", flag.ExitOnError) // usage says "checkout", not go run's temporary path
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), "checkout serves a demo checkout API (POST /checkout, GET /stock/{sku}) on the stock library.\n\nUsage: checkout [flags]\n\nFlags:\n")
		flag.PrintDefaults()
	}
	var cfg config
	flag.StringVar(&cfg.addr, "addr", ":8080", "listen `address`")
	flag.StringVar(&cfg.redis, "redis", "", "a real Redis: host:port, or redis://user:password@host:port (rediss:// for TLS) (default: an embedded miniredis)")
	flag.StringVar(&cfg.prefix, "prefix", "checkout", "Redis key prefix")
	flag.DurationVar(&cfg.holdTTL, "hold-ttl", 10*time.Minute, "how long a hold waits for its payment")
	flag.DurationVar(&cfg.keyTTL, "key-ttl", 24*time.Hour, "how long an Idempotency-Key stays bound to its purchase after its first use (at least -hold-ttl plus 30s)")
	flag.Int64Var(&cfg.userLimit, "user-limit", 2, "most units of one item per user (0: no limit)")
	flag.StringVar(&cfg.load, "load", "sneaker-42=10,tee-7=100", "items to load at start: `sku=qty,...`")
	flag.StringVar(&cfg.decline, "decline", "", "comma-separated `users` whose payments are declined")
	flag.DurationVar(&cfg.payDelay, "pay-delay", 0, "how long a payment takes")
	flag.DurationVar(&cfg.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long in-flight requests may take to finish at shutdown")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	slog.SetDefault(log)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, cfg, log); err != nil {
		log.Error("checkout", "err", err)
		stop()
		os.Exit(1)
	}
}

// config is what serve needs: the flags.
type config struct {
	addr, redis, prefix       string
	holdTTL, keyTTL           time.Duration
	userLimit                 int64
	load, decline             string
	payDelay, shutdownTimeout time.Duration

	// started, for tests, is called once the server takes traffic, with its address, its
	// Reserver and its database of record.
	started func(addr string, r *stock.Reserver, db *memstore.Store)
}

// closeTimeout bounds the wait of Reserver.Close at shutdown. The wait is bounded anyway (by
// RunOptions.Drain for Run, 5s by default, and by WithTimeout for each command); this is a
// last guard against a Redis that stopped answering.
const closeTimeout = 30 * time.Second

// serve runs the service until ctx ends (SIGINT, SIGTERM), then shuts it down: HTTP first, then
// the stock library's background work.
func serve(ctx context.Context, cfg config, log *slog.Logger) (err error) {
	if cfg.keyTTL < cfg.holdTTL+flowTimeout {
		// A retry while the order may still be held or paying must find the key's record.
		return fmt.Errorf("-key-ttl %v is shorter than -hold-ttl %v plus %v", cfg.keyTTL, cfg.holdTTL, flowTimeout)
	}

	var opt rueidis.ClientOption
	if cfg.redis != "" {
		o, err := redisaddr.Parse(cfg.redis)
		if err != nil {
			return fmt.Errorf("-redis %v", err)
		}
		o.ForceSingleClient = len(o.InitAddress) == 1
		opt = o
	} else {
		// It tells its maxmemory-policy (noeviction: miniredis never evicts), so the library's
		// memory-policy check passes without a warning.
		m, err := embedredis.Start()
		if err != nil {
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
	// WithUserRequired: with a limit set, a take without a user is refused (ErrInvalid) instead
	// of being left out of the limit. The handler checks the user first; this is the backstop.
	r, err := stock.New(client, stock.WithPrefix(cfg.prefix), stock.WithUserLimit(cfg.userLimit),
		stock.WithUserRequired(), stock.WithLogger(log))
	if err != nil {
		return err
	}
	// On every return, before the client closes: stop Run and wait for the Reserver's writes
	// (the normal shutdown below closes it first; Close is idempotent).
	defer r.Close(context.WithoutCancel(ctx))
	// The Idempotency-Key records, "<prefix>|key:...": beside the library's keys, never among them.
	keys, err := NewKeys(client, cfg.prefix, cfg.keyTTL)
	if err != nil {
		return err
	}

	// The database of record. It is in memory here, so that the example runs with nothing but
	// Go; a real service opens its database instead, and the rest stays as it is:
	//
	//	db, err := sqlstore.New(sqlDB, sqlstore.Postgres) // sqlDB: the service's *sql.DB
	//	if err != nil {
	//		return err
	//	}
	//	if err := db.Migrate(ctx); err != nil { // makes the two tables if they do not exist
	//		return err
	//	}
	db := memstore.New()
	for item := range strings.SplitSeq(cfg.load, ",") {
		if item == "" {
			continue
		}
		sku, n, ok := strings.Cut(item, "=")
		qty, err := strconv.ParseInt(n, 10, 64)
		if !ok || err != nil {
			return fmt.Errorf("-load %q: want sku=qty", item)
		}
		// The database of record first (a row it has is kept: its stock wins), then Redis with
		// the store's stock. An item already live in Redis is kept as it is.
		if _, err := stockops.Preheat(ctx, r, db, sku, qty); errors.Is(err, stock.ErrLoaded) {
			log.Info("item already live; kept as it is", "sku", sku)
		} else if err != nil {
			return err
		}
	}

	pay := NewFakePayments()
	pay.Delay = cfg.payDelay
	for u := range strings.SplitSeq(cfg.decline, ",") {
		if u != "" {
			pay.Decline(u)
		}
	}

	// The background work (relay, reconciler, failover guard, sweeper, cart recovery) in one
	// goroutine, its options checked first: options out of range would make Run return at once,
	// running nothing. It runs until r.Close stops it at shutdown, once the HTTP side is quiet,
	// not on ctx, which a signal ends first.
	opts := stock.RunOptions{Store: db}
	if err := opts.Validate(); err != nil {
		return err
	}
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(context.WithoutCancel(ctx), opts) }()
	running := true // Run has not returned (its error is still in runErr)
	defer func() {
		if running {
			r.Close(context.WithoutCancel(ctx))
			logRunStopped(log, <-runErr)
		}
	}()
	// Take traffic once sales are taken: at once on a new deployment; after a Redis failover,
	// once a reconcile pass compared Redis with the store (Run starts one at once).
	if stopped, err := ready(ctx, r, runErr); err != nil {
		running = !stopped
		return err
	}

	srv := &http.Server{
		Addr:              cfg.addr,
		Handler:           NewHandler(r, keys, pay, cfg.holdTTL, log),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      flowTimeout + 5*time.Second,
		IdleTimeout:       time.Minute,
	}
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return err
	}
	log.Info("checkout listening", "addr", ln.Addr().String(), "redis", orDefault(redisaddr.Redact(cfg.redis), "embedded miniredis"), "hold_ttl", cfg.holdTTL)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	if cfg.started != nil {
		cfg.started(ln.Addr().String(), r, db)
	}

	shutdown := func() {
		log.Info("shutting down: finishing in-flight requests", "timeout", cfg.shutdownTimeout)
		sctx, cancel := context.WithTimeout(context.Background(), cfg.shutdownTimeout)
		defer cancel()
		if err := srv.Shutdown(sctx); errors.Is(err, context.DeadlineExceeded) {
			log.Warn("shutdown timed out; closing the remaining connections")
			srv.Close()
		}
	}
	select {
	case err = <-served: // the listener failed
	case <-ctx.Done():
		shutdown()
	case rerr := <-runErr:
		// Run stopped on its own: only at its start (a Redis whose maxmemory-policy can evict
		// keys, say). Without it no sale reaches the database of record: stop taking orders.
		running = false
		shutdown()
		err = fmt.Errorf("stock: the background work stopped: %w", rerr)
	}

	// The HTTP side is quiet: Close stops Run, which delivers what is left in the outbox (up to
	// RunOptions.Drain), and waits for it and for the writes the Reserver's calls left in the
	// background. After it, nothing is written to Redis, and the Reserver answers
	// ErrReserverClosed.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer cancel()
	if cerr := r.Close(cctx); cerr != nil {
		log.Error("stock: close: the background work may still be writing", "err", cerr)
	}
	if running {
		running = false
		logRunStopped(log, <-runErr)
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	if err == nil {
		log.Info("stopped")
	}
	return err
}

// ready waits until r takes sales (Reserver.Ready). It returns ctx's error when ctx ends first,
// and Run's, with stopped set, when Run stops first (an error at its start, which Ready would
// not see).
func ready(ctx context.Context, r *stock.Reserver, runErr <-chan error) (stopped bool, err error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Ready(rctx) }()
	select {
	case err := <-done:
		return false, err
	case err := <-runErr:
		return true, fmt.Errorf("stock: the background work stopped before the service was ready: %w", err)
	}
}

// logRunStopped logs what Run returned once Close stopped it: ErrReserverClosed, or the first
// error one of its loops met.
func logRunStopped(log *slog.Logger, err error) {
	if errors.Is(err, stock.ErrReserverClosed) {
		log.Info("stock: background work stopped")
		return
	}
	log.Warn("stock: background work stopped", "err", err)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
