package queuetest

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/stockops"
)

// The queue path with consumer processes killed by SIGKILL: Reserver → Relay (no store) → the
// adapter's publisher → its broker → a consumer in a child process → stock.Consume → a store
// on a SQLite file that the parent reads too. The child is the adapter's TestConsumerProcess,
// run again from the test binary with the adapter's environment variable set; the adapter
// says how to reach its broker, how to receive and how to acknowledge.

// Store is the store of the kill tests (sqlstore on a SQLite file): a stock.Store the parent
// can migrate, load and list.
type Store interface {
	stock.Store
	Migrate(ctx context.Context) error
	Load(ctx context.Context, sku string, qty int64) error
	List(ctx context.Context, sku, after string, limit int) ([]stock.Record, error)
}

// OpenSQLite opens the SQLite file path with the driver "sqlite" (modernc.org/sqlite, which the
// adapter's test registers: this module does not require it) in WAL mode, with immediate
// transactions and a long busy timeout, as parent and children share it; makes the store with
// newStore and migrates it.
func OpenSQLite(t testing.TB, path string, newStore func(*sql.DB) (Store, error)) Store {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	s, err := newStore(db)
	require.NoError(t, err)
	require.NoError(t, s.Migrate(context.Background()))
	return s
}

// ChildConfig is what a consumer child is told, as JSON in the adapter's variable.
type ChildConfig struct {
	Broker json.RawMessage // the adapter's own: how to reach the broker
	Redis  string
	Prefix string
	DB     string // SQLite file
	// HangAfterAcks: after acknowledging this many messages, print "HANG" at the next one and
	// stop, holding it unacknowledged (the parent then kills the process). 0: never.
	HangAfterAcks int
}

// Message is a message a consumer child was handed, in terms of no broker.
type Message struct {
	Event     stock.Event
	Err       error  // not nil: the message does not decode
	Body      []byte // as the broker holds it, printed when the child hangs on it
	Delivered uint64 // how many times the broker delivered it; 0 if it does not say
	Ack       func() error
	Retry     func()
	Drop      func() // for a message that does not decode; nil: Ack
}

// Child is how an adapter's consumer child reaches its broker.
type Child struct {
	Env string // the variable that holds the ChildConfig
	// NewStore makes the store (sqlstore.New(db, sqlstore.SQLite)) on the SQLite file the
	// parent and the children share.
	NewStore func(db *sql.DB) (Store, error)
	// Consumer starts a consumer of the broker from cfg (cfg.Broker is the adapter's).
	Consumer func(t *testing.T, cfg ChildConfig) Receiver
}

// A Receiver returns the next messages of the child's consumer (none after a short wait), as
// they arrive. With an error and no messages (nil), the child waits a little and asks again.
type Receiver func(ctx context.Context) (iter.Seq[Message], error)

// Slice returns the messages of msgs as a Receiver returns them.
func Slice(msgs []Message) iter.Seq[Message] { return slices.Values(msgs) }

// RunChild is the body of an adapter's TestConsumerProcess: it skips unless c.Env is set, and
// consumes until killed. It prints one line per message:
// "MSG <type> <id> <seq> <delivered> ok|retry <error>".
func RunChild(t *testing.T, c Child) {
	raw := os.Getenv(c.Env)
	if raw == "" {
		t.Skip("runs only as a consumer child process of the kill tests")
	}
	var cfg ChildConfig
	require.NoError(t, json.Unmarshal([]byte(raw), &cfg))
	ctx := context.Background()
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{cfg.Redis}, ForceSingleClient: true, DisableCache: true})
	require.NoError(t, err)
	r, err := stock.New(rc, stock.WithPrefix(cfg.Prefix))
	require.NoError(t, err)
	store := OpenSQLite(t, cfg.DB, c.NewStore)
	receive := c.Consumer(t, cfg)
	out := bufio.NewWriter(os.Stdout)
	say := func(format string, args ...any) {
		fmt.Fprintf(out, format+"\n", args...)
		_ = out.Flush()
	}
	say("READY")
	acks := 0
	for {
		msgs, err := receive(ctx)
		if err != nil {
			say("FETCH %v", err)
			if msgs == nil {
				time.Sleep(50 * time.Millisecond)
				continue
			}
		}
		for m := range msgs {
			if cfg.HangAfterAcks > 0 && acks == cfg.HangAfterAcks {
				say("HANG %s", m.Body)
				select {} // killed here, the message unacknowledged
			}
			if m.Err != nil {
				say("BAD %v", m.Err)
				if m.Drop != nil {
					m.Drop()
				} else {
					_ = m.Ack()
				}
				continue
			}
			ev := m.Event
			err := stock.Consume(ctx, r, store, ev)
			if err == nil || errors.Is(err, stock.ErrInvalid) {
				if aerr := m.Ack(); aerr != nil {
					say("MSG %s %s %d %d retry ack: %v", ev.Type, ev.ID, ev.Seq, m.Delivered, aerr)
					continue
				}
				acks++
				say("MSG %s %s %d %d ok", ev.Type, ev.ID, ev.Seq, m.Delivered)
				continue
			}
			say("MSG %s %s %d %d retry %v", ev.Type, ev.ID, ev.Seq, m.Delivered, err)
			m.Retry()
		}
	}
}

// KillRig is a queue path whose consumers are child processes.
type KillRig struct {
	T      *testing.T
	Client rueidis.Client
	R      *stock.Reserver
	Store  Store
	Relay  *stockops.Relay

	cfg     ChildConfig
	env     string
	settled func() bool
	lines   chan string
	mu      sync.Mutex
	results []string // "MSG" lines of every child
}

// Kill is how an adapter's kill tests set up their rig.
type Kill struct {
	Child
	// Broker sets up the broker for the test and returns what a child needs to reach it (put
	// into ChildConfig.Broker as JSON) and the publisher of the relay. It runs after the
	// -short check and before Redis starts.
	Broker func() (child any, pub stock.Publisher)
	// Settled, if not nil, says whether the broker has nothing left to deliver or acknowledge;
	// Settled waits for it too.
	Settled func() bool
}

// NewKillRig skips under -short, sets up the broker, starts Redis (a real redis-server when
// STOCK_REDIS_SERVER is set, else an in-process miniredis the children reach over TCP), and
// opens the store on a SQLite file of the test's own.
func NewKillRig(t *testing.T, k Kill) *KillRig {
	if testing.Short() {
		t.Skip("starts consumer processes")
	}
	child, pub := k.Broker()
	broker, err := json.Marshal(child)
	require.NoError(t, err)
	var addr string
	var c rueidis.Client
	if redistest.ServerBinary(t) != "" {
		s := redistest.StartServer(t)
		addr, c = s.Addr(), s.Client(t)
	} else {
		m, mc := redistest.Miniredis(t)
		addr, c = m.Addr(), mc
	}
	rg := &KillRig{T: t, Client: c, env: k.Env, settled: k.Settled, lines: make(chan string, 1024)}
	rg.cfg = ChildConfig{Broker: broker, Redis: addr, Prefix: "killtest", DB: filepath.Join(t.TempDir(), "store.sqlite")}
	rg.R, err = stock.New(c, stock.WithPrefix(rg.cfg.Prefix))
	require.NoError(t, err)
	rg.Store = OpenSQLite(t, rg.cfg.DB, k.NewStore)
	rg.Relay, err = stockops.NewRelay(rg.R, nil, pub, &stock.RelayOptions{Poll: 20 * time.Millisecond})
	require.NoError(t, err)
	return rg
}

// Start starts a consumer child (see ChildConfig.HangAfterAcks); its lines go to WaitLine.
func (rg *KillRig) Start(hangAfter int) *exec.Cmd {
	cfg := rg.cfg
	cfg.HangAfterAcks = hangAfter
	raw, err := json.Marshal(cfg)
	require.NoError(rg.T, err)
	cmd := exec.Command(os.Args[0], "-test.run=^TestConsumerProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), rg.env+"="+string(raw))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(rg.T, err)
	require.NoError(rg.T, cmd.Start())
	rg.T.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
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

// WaitLine waits for a line of a child that starts with prefix.
func (rg *KillRig) WaitLine(prefix string, d time.Duration) string {
	deadline := time.After(d)
	for {
		select {
		case l := <-rg.lines:
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-deadline:
			rg.T.Fatalf("no %q line from the consumer child within %v", prefix, d)
		}
	}
}

// KillChild kills a child with SIGKILL.
func KillChild(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
}

// DrainRelay publishes every pending event.
func (rg *KillRig) DrainRelay() {
	for range 1000 {
		st, err := rg.Relay.Once(context.Background())
		require.NoError(rg.T, err)
		if st.Claimed == 0 {
			return
		}
	}
	rg.T.Fatal("the relay did not drain")
}

// Settled waits until Redis has nothing pending, published or dead for skus, the broker's
// Settled (if any) says so and done says so.
func (rg *KillRig) Settled(skus []string, d time.Duration, done func() bool) {
	ctx := context.Background()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		rg.DrainRelay()
		left := int64(0)
		for _, sku := range skus {
			for _, suffix := range []string{":o", ":p", ":dl"} {
				n, err := rg.Client.Do(ctx, rg.Client.B().Zcard().Key(rg.cfg.Prefix+":{"+sku+"}"+suffix).Build()).AsInt64()
				require.NoError(rg.T, err)
				left += n
			}
		}
		if left == 0 && (rg.settled == nil || rg.settled()) && done() {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	rg.T.Fatalf("the consumers did not apply every event within %v", d)
}

// Handled returns the "MSG" lines of every child so far.
func (rg *KillRig) Handled() []string {
	rg.mu.Lock()
	defer rg.mu.Unlock()
	return append([]string(nil), rg.results...)
}

// Has says whether a child printed a "MSG" line that starts with prefix.
func (rg *KillRig) Has(prefix string) bool {
	for _, l := range rg.Handled() {
		if strings.HasPrefix(l, prefix) {
			return true
		}
	}
	return false
}

// Figures counts the children's results: messages handled, redeliveries (a delivery count
// above 1, where the broker says) and deliveries not acknowledged (held back or failed).
func (rg *KillRig) Figures() (msgs, redelivered, retried int) {
	for _, l := range rg.Handled() {
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

// Refusals returns the ids of sku the store refused.
func (rg *KillRig) Refusals(sku string) []string {
	var out []string
	after := ""
	for {
		recs, err := rg.Store.List(context.Background(), sku, after, 500)
		require.NoError(rg.T, err)
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

// ConsumerKilledKeepsOrder is the body of an adapter's TestConsumerKilledKeepsOrder: one unit;
// deduct a, restore a, deduct b. A consumer process acks D(a), takes R(a) and is killed by
// SIGKILL before it acks it; its successor gets R(a) again once the broker notices the death,
// maybe after D(b). The store must still get R(a) before D(b) (Consume applies R(a) from Redis
// first): it ends with a restored and b applied, not refused and given back. check, if not nil,
// looks at the children's "MSG" lines first (the order the broker handed the events over in).
func ConsumerKilledKeepsOrder(t *testing.T, rg *KillRig, check func(results []string)) {
	ctx := context.Background()
	sku := "one"
	require.NoError(t, rg.R.Load(ctx, sku, 1))
	require.NoError(t, rg.Store.Load(ctx, sku, 1))
	_, err := rg.R.Deduct(ctx, stock.Request{SKU: sku, ID: "a", Qty: 1})
	require.NoError(t, err)
	_, err = rg.R.Restore(ctx, sku, "a")
	require.NoError(t, err)
	_, err = rg.R.Deduct(ctx, stock.Request{SKU: sku, ID: "b", Qty: 1})
	require.NoError(t, err)
	rg.DrainRelay()

	first := rg.Start(1)
	rg.WaitLine("READY", 20*time.Second)
	hang := rg.WaitLine("HANG", 20*time.Second)
	assert.Contains(t, hang, `"restored"`, "the first consumer dies holding R(a)")
	KillChild(t, first)

	second := rg.Start(0)
	rg.Settled([]string{sku}, 30*time.Second, func() bool { return rg.Has("MSG restored a ") && rg.Has("MSG deducted b ") })
	KillChild(t, second)
	results := rg.Handled()
	t.Logf("consumer results:\n%s", strings.Join(results, "\n"))
	if check != nil {
		check(results)
	}

	recs, err := rg.Store.Records(ctx, sku, []string{"a", "b"})
	require.NoError(t, err)
	assert.Equal(t, stock.StateRestored, recs["a"].Status)
	assert.Equal(t, stock.StateApplied, recs["b"].Status, "b's valid sale is applied, not refused")
	e, err := rg.R.Ledger(ctx, sku, "b")
	require.NoError(t, err)
	assert.Equal(t, stock.StateApplied, e.State, "b's stock is not given back")
	rem, err := rg.Store.Remaining(ctx, sku)
	require.NoError(t, err)
	l, err := rg.R.Levels(ctx, sku)
	require.NoError(t, err)
	assert.Zero(t, rem)
	assert.Zero(t, l.Available)
	msgs, redelivered, retried := rg.Figures()
	t.Logf("events 3, kills 1, messages handled %d, redeliveries %d, held back or retried %d, refusals %d",
		msgs, redelivered, retried, len(rg.Refusals(sku)))
}

// Random is the shape of ConsumersKilledRandom.
type Random struct {
	Buyers      int    // goroutines that deduct and restore
	Seed        uint64 // the second word of each buyer's PCG seed
	PauseMin    int    // a buyer pauses PauseMin to PauseMin+PauseSpread-1 ms between operations
	PauseSpread int
	AliveMin    int // a consumer lives AliveMin to AliveMin+AliveSpread-1 ms before its kill
	AliveSpread int
	// Redelivers: the broker counts deliveries (Message.Delivered); the kills must have left
	// messages it delivered again.
	Redelivers bool
}

// ConsumersKilledRandom is the body of an adapter's TestConsumersKilledRandom: buyers deduct
// and restore at the edge of the stock of three items of 3 units while the relay publishes and
// consumer processes apply the events; three consumers are killed by SIGKILL at random
// moments, each successor getting redeliveries maybe out of order. No valid sale may be
// refused by the store, and Redis and the store end equal.
func ConsumersKilledRandom(t *testing.T, rg *KillRig, o Random) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	skus := []string{"k0", "k1", "k2"}
	for _, sku := range skus {
		require.NoError(t, rg.R.Load(ctx, sku, 3))
		require.NoError(t, rg.Store.Load(ctx, sku, 3))
	}
	var relayWG sync.WaitGroup
	relayWG.Go(func() { _ = rg.Relay.Run(ctx) })

	var ops, taken atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range o.Buyers {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(w), o.Seed))
			var mine []stock.Receipt
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if len(mine) > 0 && rnd.IntN(2) == 0 {
					k := rnd.IntN(len(mine))
					rc := mine[k]
					mine = append(mine[:k], mine[k+1:]...)
					_, err := rg.R.Restore(ctx, rc.SKU, rc.ID)
					assert.NoError(t, err)
				} else {
					rc, err := rg.R.Deduct(ctx, stock.Request{SKU: skus[rnd.IntN(len(skus))], ID: fmt.Sprintf("w%d-%d", w, i), Qty: 1})
					if err == nil {
						mine = append(mine, rc)
						taken.Add(1)
					} else if !errors.Is(err, stock.ErrSoldOut) {
						t.Error(err)
					}
				}
				ops.Add(1)
				time.Sleep(time.Duration(o.PauseMin+rnd.IntN(o.PauseSpread)) * time.Millisecond)
			}
		})
	}
	kills := 0
	for range 3 {
		cmd := rg.Start(0)
		rg.WaitLine("READY", 20*time.Second)
		time.Sleep(time.Duration(o.AliveMin+rand.IntN(o.AliveSpread)) * time.Millisecond)
		KillChild(t, cmd)
		kills++
	}
	close(stop)
	wg.Wait()
	last := rg.Start(0)
	// A bound, not a wait: a loaded CI machine has taken over a minute here.
	rg.Settled(skus, 3*time.Minute, func() bool { return true })
	KillChild(t, last)
	cancel()
	relayWG.Wait()

	msgs, redelivered, retried := rg.Figures()
	var refused []string
	for _, sku := range skus {
		refused = append(refused, rg.Refusals(sku)...)
		rem, err := rg.Store.Remaining(context.Background(), sku)
		require.NoError(t, err)
		l, err := rg.R.Levels(context.Background(), sku)
		require.NoError(t, err)
		assert.Equal(t, l.Available, rem, "%s: Redis and the store agree", sku)
	}
	t.Logf("operations %d (%d sales), consumer kills %d, messages handled %d, redeliveries %d, held back or retried %d, store refusals %d",
		ops.Load(), taken.Load(), kills, msgs, redelivered, retried, len(refused))
	assert.Equal(t, 3, kills)
	if o.Redelivers {
		assert.Positive(t, redelivered, "the kills left messages to redeliver")
	}
	assert.Empty(t, refused, "the store refused valid sales: an item's events were applied out of order")
}
