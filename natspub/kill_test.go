package natspub_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/natspub"
	"github.com/stockres/stock/sqlstore"
	"github.com/stockres/stock/stockops"
)

// The queue path with consumer processes killed by SIGKILL: Reserver → Relay (no store) →
// natspub → JetStream → a durable pull consumer in a child process → stock.Consume → sqlstore
// on a SQLite file that the parent reads too.

// childEnv names the variable that makes TestConsumerProcess run as a consumer child.
const childEnv = "STOCK_NATSPUB_CONSUMER_CHILD"

// childConfig is what a consumer child is told, as JSON in childEnv.
type childConfig struct {
	NATS, Stream, Durable string
	Redis, Prefix         string
	DB                    string // SQLite file
	Batch                 int
	// HangAfterAcks: after acknowledging this many messages, print "HANG" at the next one and
	// stop, holding it unacknowledged (the parent then kills the process). 0: never.
	HangAfterAcks int
}

// TestConsumerProcess is the consumer child; it skips unless childEnv is set. It prints one
// line per message: "MSG <type> <id> <seq> <delivered> ok|retry <error>".
func TestConsumerProcess(t *testing.T) {
	raw := os.Getenv(childEnv)
	if raw == "" {
		t.Skip("runs only as a consumer child process of the kill tests")
	}
	var cfg childConfig
	require.NoError(t, json.Unmarshal([]byte(raw), &cfg))
	ctx := context.Background()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{cfg.Redis}, ForceSingleClient: true, DisableCache: true})
	require.NoError(t, err)
	r, err := stock.New(c, stock.WithPrefix(cfg.Prefix))
	require.NoError(t, err)
	store := openStore(t, cfg.DB)
	nc, err := nats.Connect(cfg.NATS)
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	cons, err := js.Consumer(ctx, cfg.Stream, cfg.Durable)
	require.NoError(t, err)
	out := bufio.NewWriter(os.Stdout)
	say := func(format string, args ...any) {
		fmt.Fprintf(out, format+"\n", args...)
		_ = out.Flush()
	}
	say("READY")
	acks := 0
	for {
		batch, err := cons.Fetch(cfg.Batch, jetstream.FetchMaxWait(300*time.Millisecond))
		if err != nil {
			say("FETCH %v", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		for m := range batch.Messages() {
			if cfg.HangAfterAcks > 0 && acks == cfg.HangAfterAcks {
				say("HANG %s", m.Data())
				select {} // killed here, the message unacknowledged
			}
			ev, err := natspub.Decode(m.Data())
			if err != nil {
				say("BAD %v", err)
				_ = m.Term()
				continue
			}
			var raw struct {
				Seq int64 `json:"seq"`
			}
			_ = json.Unmarshal(m.Data(), &raw) // the sequence as published, for the log
			md, _ := m.Metadata()
			delivered := uint64(0)
			if md != nil {
				delivered = md.NumDelivered
			}
			err = stock.Consume(ctx, r, store, ev)
			if err == nil {
				if aerr := m.DoubleAck(ctx); aerr != nil {
					say("MSG %s %s %d %d retry ack: %v", ev.Type, ev.ID, raw.Seq, delivered, aerr)
					continue
				}
				acks++
				say("MSG %s %s %d %d ok", ev.Type, ev.ID, raw.Seq, delivered)
				continue
			}
			say("MSG %s %s %d %d retry %v", ev.Type, ev.ID, raw.Seq, delivered, err)
			_ = m.NakWithDelay(100 * time.Millisecond)
		}
	}
}

func openStore(t testing.TB, path string) *sqlstore.Store {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	s, err := sqlstore.New(db, sqlstore.SQLite)
	require.NoError(t, err)
	require.NoError(t, s.Migrate(context.Background()))
	return s
}

// killRig is a queue path whose consumers are child processes.
type killRig struct {
	t       *testing.T
	e       *env
	cfg     childConfig
	client  rueidis.Client
	r       *stock.Reserver
	store   *sqlstore.Store
	relay   *stockops.Relay
	lines   chan string
	mu      sync.Mutex
	results []string // "MSG" lines of every child
}

// newKillRig starts Redis (a real redis-server when STOCK_REDIS_SERVER is set, else an
// in-process miniredis the children reach over TCP), a SQLite store file, a stream and a
// durable consumer whose unacknowledged messages are redelivered after ackWait.
func newKillRig(t *testing.T, ackWait time.Duration) *killRig {
	e := newEnv(t)
	var addr string
	var c rueidis.Client
	if redistest.ServerBinary(t) != "" {
		s := redistest.StartServer(t)
		addr, c = s.Addr(), s.Client(t)
	} else {
		m, mc := redistest.Miniredis(t)
		addr, c = m.Addr(), mc
	}
	ctx := context.Background()
	durable := "store"
	_, err := e.js.CreateOrUpdateConsumer(ctx, e.stream, jetstream.ConsumerConfig{
		Durable:       durable,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		FilterSubject: e.prefix + ".>",
	})
	require.NoError(t, err)
	rg := &killRig{t: t, e: e, client: c, lines: make(chan string, 1024)}
	rg.cfg = childConfig{NATS: e.nc.ConnectedUrl(), Stream: e.stream, Durable: durable, Redis: addr,
		Prefix: "killtest", DB: filepath.Join(t.TempDir(), "store.sqlite"), Batch: 8}
	rg.r, err = stock.New(c, stock.WithPrefix(rg.cfg.Prefix))
	require.NoError(t, err)
	rg.store = openStore(t, rg.cfg.DB)
	pub, err := natspub.New(e.js, natspub.WithPrefix(e.prefix), natspub.WithStream(e.stream), natspub.WithTimeout(5*time.Second))
	require.NoError(t, err)
	rg.relay, err = stockops.NewRelay(rg.r, nil, pub, &stock.RelayOptions{Poll: 20 * time.Millisecond})
	require.NoError(t, err)
	return rg
}

// start starts a consumer child; its lines go to rg.lines.
func (rg *killRig) start(hangAfter int) *exec.Cmd {
	cfg := rg.cfg
	cfg.HangAfterAcks = hangAfter
	if hangAfter > 0 {
		cfg.Batch = 2
	}
	raw, err := json.Marshal(cfg)
	require.NoError(rg.t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^TestConsumerProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(rg.t, err)
	require.NoError(rg.t, cmd.Start())
	rg.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "MSG ") {
				rg.mu.Lock()
				rg.results = append(rg.results, line)
				rg.mu.Unlock()
			}
			select {
			case rg.lines <- line:
			default:
			}
		}
	}()
	return cmd
}

// waitLine waits for a line of a child that starts with prefix.
func (rg *killRig) waitLine(prefix string, d time.Duration) string {
	deadline := time.After(d)
	for {
		select {
		case l := <-rg.lines:
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-deadline:
			rg.t.Fatalf("no %q line from the consumer child within %v", prefix, d)
		}
	}
}

func kill(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
}

// drainRelay publishes every pending event.
func (rg *killRig) drainRelay() {
	for range 1000 {
		st, err := rg.relay.Once(context.Background())
		require.NoError(rg.t, err)
		if st.Claimed == 0 {
			return
		}
	}
	rg.t.Fatal("the relay did not drain")
}

// settled waits until the consumers have applied every event Redis queued: nothing pending,
// published or dead in Redis for skus, and every message of the stream acknowledged.
func (rg *killRig) settled(skus []string, d time.Duration) {
	ctx := context.Background()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		rg.drainRelay()
		left := int64(0)
		for _, sku := range skus {
			for _, suffix := range []string{":o", ":p", ":dl"} {
				n, err := rg.client.Do(ctx, rg.client.B().Zcard().Key(rg.cfg.Prefix+":{"+sku+"}"+suffix).Build()).AsInt64()
				require.NoError(rg.t, err)
				left += n
			}
		}
		if left == 0 {
			cons, err := rg.e.js.Consumer(ctx, rg.cfg.Stream, rg.cfg.Durable)
			require.NoError(rg.t, err)
			info, err := cons.Info(ctx)
			require.NoError(rg.t, err)
			if info.NumPending == 0 && info.NumAckPending == 0 {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	rg.t.Fatalf("the consumers did not apply every event within %v", d)
}

// figures counts the children's results: messages handled, redeliveries (a delivery count
// above 1) and deliveries not acknowledged (held back or failed).
func (rg *killRig) figures() (msgs, redelivered, retried int) {
	rg.mu.Lock()
	defer rg.mu.Unlock()
	for _, l := range rg.results {
		f := strings.Fields(l)
		if len(f) < 6 {
			continue
		}
		msgs++
		if n, _ := strconv.Atoi(f[4]); n > 1 {
			redelivered++
		}
		if f[5] != "ok" {
			retried++
		}
	}
	return
}

// refusals returns the ids of sku the store refused.
func (rg *killRig) refusals(sku string) []string {
	var out []string
	after := ""
	for {
		recs, err := rg.store.List(context.Background(), sku, after, 500)
		require.NoError(rg.t, err)
		for _, rec := range recs {
			after = rec.ID
			if rec.Status == stock.StateRefused {
				out = append(out, rec.ID)
			}
		}
		if len(recs) < 500 {
			return out
		}
	}
}

// TestConsumerKilledKeepsOrder: one unit; deduct a, restore a, deduct b, published to
// JetStream. A consumer process acks D(a), takes R(a) and is killed by SIGKILL before it acks
// it; its successor is handed D(b) first, R(a) only after the ack wait. The store must still
// get R(a) before D(b) (Consume applies R(a) from Redis first): b's sale is applied, not
// refused and given back.
func TestConsumerKilledKeepsOrder(t *testing.T) {
	rg := newKillRig(t, 2*time.Second)
	ctx := context.Background()
	sku := "one"
	require.NoError(t, rg.r.Load(ctx, sku, 1))
	require.NoError(t, rg.store.Load(ctx, sku, 1))
	_, err := rg.r.Deduct(ctx, stock.Request{SKU: sku, ID: "a", Qty: 1})
	require.NoError(t, err)
	_, err = rg.r.Restore(ctx, sku, "a")
	require.NoError(t, err)
	_, err = rg.r.Deduct(ctx, stock.Request{SKU: sku, ID: "b", Qty: 1})
	require.NoError(t, err)
	rg.drainRelay()

	first := rg.start(1)
	rg.waitLine("READY", 20*time.Second)
	hang := rg.waitLine("HANG", 20*time.Second)
	assert.Contains(t, hang, `"restored"`, "the first consumer dies holding R(a)")
	kill(t, first)

	second := rg.start(0)
	rg.settled([]string{sku}, 30*time.Second)
	kill(t, second)

	rg.mu.Lock()
	results := append([]string(nil), rg.results...)
	rg.mu.Unlock()
	t.Logf("consumer results:\n%s", strings.Join(results, "\n"))
	require.GreaterOrEqual(t, len(results), 2)
	assert.True(t, strings.HasPrefix(results[1], "MSG deducted b "),
		"the successor must be handed D(b) before the redelivered R(a), or the test proves nothing: %s", results[1])

	recs, err := rg.store.Records(ctx, sku, []string{"a", "b"})
	require.NoError(t, err)
	assert.Equal(t, stock.StateRestored, recs["a"].Status)
	assert.Equal(t, stock.StateApplied, recs["b"].Status, "b's valid sale is applied, not refused")
	e, err := rg.r.Ledger(ctx, sku, "b")
	require.NoError(t, err)
	assert.Equal(t, stock.StateApplied, e.State, "b's stock is not given back")
	rem, err := rg.store.Remaining(ctx, sku)
	require.NoError(t, err)
	avail, err := available(rg.r.Levels(ctx, sku))
	require.NoError(t, err)
	assert.Zero(t, rem)
	assert.Zero(t, avail)
	msgs, redelivered, retried := rg.figures()
	t.Logf("events 3, kills 1, messages handled %d, redeliveries %d, held back or retried %d, refusals %d",
		msgs, redelivered, retried, len(rg.refusals(sku)))
}

// TestConsumersKilledRandom: buyers deduct and restore at the edge of the stock of a few items
// while the relay publishes to JetStream and consumer processes apply the events; three
// consumers are killed by SIGKILL at random moments, each successor getting redeliveries out
// of order. No valid sale may be refused by the store, and Redis and the store end equal.
func TestConsumersKilledRandom(t *testing.T) {
	rg := newKillRig(t, time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	skus := []string{"k0", "k1", "k2"}
	for _, sku := range skus {
		require.NoError(t, rg.r.Load(ctx, sku, 3))
		require.NoError(t, rg.store.Load(ctx, sku, 3))
	}
	var relayWG sync.WaitGroup
	relayWG.Go(func() { _ = rg.relay.Run(ctx) })

	var ops, taken atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(w), 7))
			var mine []stock.Receipt
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				sku := skus[rnd.IntN(len(skus))]
				if len(mine) > 0 && rnd.IntN(2) == 0 {
					k := rnd.IntN(len(mine))
					rc := mine[k]
					mine = append(mine[:k], mine[k+1:]...)
					_, err := rg.r.Restore(ctx, rc.SKU, rc.ID)
					assert.NoError(t, err)
				} else {
					rc, err := rg.r.Deduct(ctx, stock.Request{SKU: sku, ID: fmt.Sprintf("w%d-%d", w, i), Qty: 1})
					if err == nil {
						mine = append(mine, rc)
						taken.Add(1)
					} else if !errors.Is(err, stock.ErrSoldOut) {
						t.Error(err)
					}
				}
				ops.Add(1)
				time.Sleep(time.Duration(1+rnd.IntN(4)) * time.Millisecond)
			}
		})
	}
	kills := 0
	for range 3 {
		cmd := rg.start(0)
		rg.waitLine("READY", 20*time.Second)
		time.Sleep(time.Duration(400+rand.IntN(1200)) * time.Millisecond)
		kill(t, cmd)
		kills++
	}
	close(stop)
	wg.Wait()
	last := rg.start(0)
	rg.settled(skus, 60*time.Second)
	kill(t, last)
	cancel()
	relayWG.Wait()

	msgs, redelivered, retried := rg.figures()
	var refused []string
	for _, sku := range skus {
		refused = append(refused, rg.refusals(sku)...)
		rem, err := rg.store.Remaining(context.Background(), sku)
		require.NoError(t, err)
		avail, err := available(rg.r.Levels(context.Background(), sku))
		require.NoError(t, err)
		assert.Equal(t, avail, rem, "%s: Redis and the store agree", sku)
	}
	t.Logf("operations %d (%d sales), consumer kills %d, messages handled %d, redeliveries %d, held back or retried %d, store refusals %d",
		ops.Load(), taken.Load(), kills, msgs, redelivered, retried, len(refused))
	assert.Equal(t, 3, kills)
	assert.Positive(t, redelivered, "the kills left messages to redeliver")
	assert.Empty(t, refused, "the store refused valid sales: an item's events were applied out of order")
}

// available returns the available units of a Levels call.
func available(l stock.Levels, err error) (int64, error) { return l.Available, err }
