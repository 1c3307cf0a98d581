package kafkapub_test

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
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	_ "modernc.org/sqlite"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/kafkapub"
	"github.com/stockres/stock/sqlstore"
	"github.com/stockres/stock/stockops"
)

// The queue path with consumer processes killed by SIGKILL: Reserver → Relay (no store) →
// kafkapub → the fake cluster (in the parent) → a group member in a child process →
// stock.Consume → sqlstore on a SQLite file that the parent reads too. A killed member does
// not leave the group: its partitions move after the session timeout, and its successor
// starts at the first message it did not acknowledge.

const childEnv = "STOCK_KAFKAPUB_CONSUMER_CHILD"

type childConfig struct {
	Brokers []string
	Redis   string
	Prefix  string
	DB      string
	// HangAfterAcks: after acknowledging this many messages, print "HANG" at the next one and
	// stop, holding it unacknowledged (the parent then kills the process). 0: never.
	HangAfterAcks int
}

const sessionTimeout = 1500 * time.Millisecond

// TestConsumerProcess is the consumer child; it skips unless childEnv is set. It prints one
// line per message: "MSG <type> <id> <seq> ok|retry <error>".
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
	cons, err := kafkapub.NewConsumer(topic, "store", &kafkapub.ConsumerOptions{RetryDelay: 100 * time.Millisecond},
		kgo.SeedBrokers(cfg.Brokers...), kgo.SessionTimeout(sessionTimeout), kgo.HeartbeatInterval(300*time.Millisecond),
		kgo.FetchMaxWait(100*time.Millisecond))
	require.NoError(t, err)
	out := bufio.NewWriter(os.Stdout)
	say := func(format string, args ...any) {
		fmt.Fprintf(out, format+"\n", args...)
		_ = out.Flush()
	}
	say("READY")
	acks := 0
	for {
		msgs, err := cons.Receive(ctx, 2, 300*time.Millisecond)
		if err != nil {
			say("FETCH %v", err)
		}
		for _, m := range msgs {
			if cfg.HangAfterAcks > 0 && acks == cfg.HangAfterAcks {
				say("HANG %s", m.Record.Value)
				select {} // killed here, the message unacknowledged
			}
			if m.Err != nil {
				say("BAD %v", m.Err)
				_ = cons.Ack(ctx, m)
				continue
			}
			ev := m.Event
			err := stock.Consume(ctx, r, store, ev)
			if err == nil || errors.Is(err, stock.ErrInvalid) {
				if aerr := cons.Ack(ctx, m); aerr != nil {
					say("MSG %s %s %d retry ack: %v", ev.Type, ev.ID, ev.Seq, aerr)
					continue
				}
				acks++
				say("MSG %s %s %d ok", ev.Type, ev.ID, ev.Seq)
				continue
			}
			say("MSG %s %s %d retry %v", ev.Type, ev.ID, ev.Seq, err)
			cons.Retry(m)
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

type killRig struct {
	t       *testing.T
	cfg     childConfig
	client  rueidis.Client
	r       *stock.Reserver
	store   *sqlstore.Store
	relay   *stockops.Relay
	lines   chan string
	mu      sync.Mutex
	results []string
}

func newKillRig(t *testing.T) *killRig {
	if testing.Short() {
		t.Skip("starts consumer processes")
	}
	fc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, topic), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(fc.Close)
	var addr string
	var c rueidis.Client
	if redistest.ServerBinary(t) != "" {
		s := redistest.StartServer(t)
		addr, c = s.Addr(), s.Client(t)
	} else {
		m, mc := redistest.Miniredis(t)
		addr, c = m.Addr(), mc
	}
	rg := &killRig{t: t, client: c, lines: make(chan string, 1024)}
	rg.cfg = childConfig{Brokers: fc.ListenAddrs(), Redis: addr, Prefix: "killtest", DB: filepath.Join(t.TempDir(), "store.sqlite")}
	rg.r, err = stock.New(c, stock.WithPrefix(rg.cfg.Prefix))
	require.NoError(t, err)
	rg.store = openStore(t, rg.cfg.DB)
	pub, err := kafkapub.New(producer(t, rg.cfg.Brokers), topic)
	require.NoError(t, err)
	rg.relay, err = stockops.NewRelay(rg.r, nil, pub, &stock.RelayOptions{Poll: 20 * time.Millisecond})
	require.NoError(t, err)
	return rg
}

func (rg *killRig) start(hangAfter int) *exec.Cmd {
	cfg := rg.cfg
	cfg.HangAfterAcks = hangAfter
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

// settled waits until Redis has nothing pending, published or dead for skus and done says so.
func (rg *killRig) settled(skus []string, d time.Duration, done func() bool) {
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
		if left == 0 && done() {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	rg.t.Fatalf("the consumers did not apply every event within %v", d)
}

func (rg *killRig) handled() []string {
	rg.mu.Lock()
	defer rg.mu.Unlock()
	return append([]string(nil), rg.results...)
}

func (rg *killRig) has(prefix string) bool {
	for _, l := range rg.handled() {
		if strings.HasPrefix(l, prefix) {
			return true
		}
	}
	return false
}

// TestConsumerKilledKeepsOrder: one unit; deduct a, restore a, deduct b. A member process acks
// D(a), takes R(a) and is killed by SIGKILL before it acks it; its successor, once the group
// notices the death, starts again at R(a). The store ends with a restored and b applied.
func TestConsumerKilledKeepsOrder(t *testing.T) {
	rg := newKillRig(t)
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
	rg.settled([]string{sku}, 30*time.Second, func() bool { return rg.has("MSG restored a ") && rg.has("MSG deducted b ") })
	kill(t, second)
	t.Logf("consumer results:\n%s", strings.Join(rg.handled(), "\n"))

	recs, err := rg.store.Records(ctx, sku, []string{"a", "b"})
	require.NoError(t, err)
	assert.Equal(t, stock.StateRestored, recs["a"].Status)
	assert.Equal(t, stock.StateApplied, recs["b"].Status, "b's valid sale is applied, not refused")
	rem, err := rg.store.Remaining(ctx, sku)
	require.NoError(t, err)
	l, err := rg.r.Levels(ctx, sku)
	require.NoError(t, err)
	assert.Zero(t, rem)
	assert.Zero(t, l.Available)
}

// TestConsumersKilledRandom: buyers deduct and restore at the edge of the stock of a few items
// while the relay publishes and member processes apply the events; three members are killed by
// SIGKILL at random moments. No valid sale may be refused by the store, and Redis and the
// store end equal.
func TestConsumersKilledRandom(t *testing.T) {
	rg := newKillRig(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	skus := []string{"k0", "k1", "k2"}
	for _, sku := range skus {
		require.NoError(t, rg.r.Load(ctx, sku, 3))
		require.NoError(t, rg.store.Load(ctx, sku, 3))
	}
	var relayWG sync.WaitGroup
	relayWG.Go(func() { _ = rg.relay.Run(ctx) })
	var ops atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(w), 11))
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
					_, err := rg.r.Restore(ctx, rc.SKU, rc.ID)
					assert.NoError(t, err)
				} else {
					rc, err := rg.r.Deduct(ctx, stock.Request{SKU: skus[rnd.IntN(len(skus))], ID: fmt.Sprintf("w%d-%d", w, i), Qty: 1})
					if err == nil {
						mine = append(mine, rc)
					} else if !errors.Is(err, stock.ErrSoldOut) {
						t.Error(err)
					}
				}
				ops.Add(1)
				time.Sleep(time.Duration(2+rnd.IntN(5)) * time.Millisecond)
			}
		})
	}
	for range 3 {
		cmd := rg.start(0)
		rg.waitLine("READY", 20*time.Second)
		time.Sleep(time.Duration(1500+rand.IntN(1500)) * time.Millisecond)
		kill(t, cmd)
	}
	close(stop)
	wg.Wait()
	last := rg.start(0)
	rg.settled(skus, 60*time.Second, func() bool { return true })
	kill(t, last)
	cancel()
	relayWG.Wait()
	msgs := rg.handled()
	refused := 0
	for _, sku := range skus {
		rem, err := rg.store.Remaining(context.Background(), sku)
		require.NoError(t, err)
		l, err := rg.r.Levels(context.Background(), sku)
		require.NoError(t, err)
		assert.Equal(t, l.Available, rem, "%s: Redis and the store agree", sku)
		recs, err := rg.store.List(context.Background(), sku, "", 10000)
		require.NoError(t, err)
		for _, rec := range recs {
			if rec.Status == stock.StateRefused {
				refused++
			}
		}
	}
	t.Logf("operations %d, consumer kills 3, messages handled %d, store refusals %d", ops.Load(), len(msgs), refused)
	assert.Zero(t, refused, "the store refused valid sales: an item's events were applied out of order")
}
