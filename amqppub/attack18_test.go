package amqppub_test

// Attack 18 on amqppub, through its exported API, on the RabbitMQ of STOCK_TEST_AMQP: a batch
// with a bad event in the middle, message ids of awkward SKUs, and consumers killed (their
// connection closed) mid-stream under a live relay. Every test uses an exchange and queues of
// its own, deleted at the end.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/stockres/stock"
	"github.com/stockres/stock/amqppub"
	"github.com/stockres/stock/internal/queuetest"
)

func a18URL(t *testing.T) string {
	u := os.Getenv("STOCK_TEST_AMQP")
	if u == "" {
		t.Skip("STOCK_TEST_AMQP is not set (e.g. amqp://guest:guest@127.0.0.1:5672/)")
	}
	return u
}

func a18Dial(t *testing.T, url string) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// a18Layout returns options for an exchange of the test's own with n queues, deleted at the end.
func a18Layout(t *testing.T, url string, n int) (string, []amqppub.Option) {
	t.Helper()
	ex := fmt.Sprintf("a18.%d.%d", time.Now().UnixNano(), rand.IntN(1e6))
	t.Cleanup(func() {
		conn, err := amqp.Dial(url)
		if err != nil {
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		for i := 0; i < n; i++ {
			_, _ = ch.QueueDelete(amqppub.Queue(ex, i), false, false, false)
		}
		_ = ch.ExchangeDelete(ex, false, false)
	})
	return ex, []amqppub.Option{amqppub.WithExchange(ex), amqppub.WithQueues(n)}
}

// a18Get takes every message of a queue (auto ack) and decodes them.
func a18Get(t *testing.T, conn *amqp.Connection, queue string) []stock.Event {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	var out []stock.Event
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return out
		}
		ev, err := amqppub.Decode(d.Body)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ev)
	}
}

// An invalid event in the middle of one item's batch: the doc says that after an event fails to
// be sent, the later events of the same item are not sent.
func TestAttack18InvalidMidBatchStopsTheItem(t *testing.T) {
	url := a18URL(t)
	ex, opts := a18Layout(t, url, 1)
	conn := a18Dial(t, url)
	pub, err := amqppub.New(conn, opts...)
	if err != nil {
		t.Fatal(err)
	}
	evs := []stock.Event{queuetest.Ev("q:1", "1", 1), queuetest.Ev("q:1", "", 2), queuetest.Ev("q:1", "3", 3), queuetest.Ev("other", "1", 1)}
	errs := pub.PublishBatch(context.Background(), evs)
	if len(errs) != len(evs) {
		t.Fatalf("%d answers for %d events", len(errs), len(evs))
	}
	if errs[0] != nil || errs[3] != nil {
		t.Errorf("the valid first event or another item's event failed: %v", errs)
	}
	if !errors.Is(errs[1], stock.ErrInvalid) {
		t.Errorf("the invalid event: %v, want ErrInvalid", errs[1])
	}
	time.Sleep(100 * time.Millisecond)
	var ids []string
	for _, ev := range a18Get(t, conn, amqppub.Queue(ex, 0)) {
		if ev.SKU == "q:1" {
			ids = append(ids, ev.ID)
		}
	}
	if errs[2] == nil {
		t.Errorf("the event after the item's invalid one was sent and answered nil (the queue has %v)", ids)
	} else if len(ids) != 1 {
		t.Errorf("answered %v for the event after the invalid one, but the queue has %v", errs[2], ids)
	}
}

// Message ids of awkward SKUs and ids: distinct events must have distinct ids, and the escaping
// must leave only letters, digits, '-', '_', '%' and the two '/' separators.
func TestAttack18MsgIDInjective(t *testing.T) {
	parts := []string{"a", "a/b", "a%2Fb", "b", "%", "/", "", "ü", "😀", "a b", "-_", "%25", "x/y/z"}
	seen := map[string]string{}
	for _, sku := range parts {
		for _, id := range parts {
			for _, typ := range []stock.EventType{stock.EventDeducted, stock.EventRestored} {
				ev := stock.Event{Type: typ, SKU: sku, ID: id}
				m := amqppub.MsgID(ev)
				k := fmt.Sprintf("%q %q %q", sku, id, typ)
				if prev, ok := seen[m]; ok {
					t.Errorf("MsgID %q for both %s and %s", m, prev, k)
				}
				seen[m] = k
				slashes := 0
				for _, r := range m {
					switch {
					case r == '/':
						slashes++
					case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '%':
					default:
						t.Errorf("MsgID %q of %s holds %q", m, k, r)
					}
				}
				if slashes != 2 {
					t.Errorf("MsgID %q of %s has %d separators", m, k, slashes)
				}
			}
		}
	}
}

// A live relay, traffic, and three consumer processes (connections) on four queues; two are killed
// (their connection closed) mid-stream while holding unacknowledged messages, one comes back.
// RabbitMQ requeues what they held for the next active consumer. The store must end equal to
// Redis and to the acknowledged answers, nothing applied twice.
func TestAttack18ConsumersKilledMidStream(t *testing.T) {
	url := a18URL(t)
	_, opts := a18Layout(t, url, 4)
	pubConn := a18Dial(t, url)
	pub, err := amqppub.New(pubConn, opts...)
	if err != nil {
		t.Fatal(err)
	}
	skus := []string{"m:1", "m:2", "m~3", "m:ü4", "m/5", "m%6", "m:7", "m:8"}
	p := queuetest.NewMiniredisPipeline(t, skus)
	ctx := context.Background()
	stopRelay := p.RunRelay(t, pub)
	stopAll := make(chan struct{})
	var wg sync.WaitGroup
	var crashedHolding atomic.Int64
	member := func(crashAfter int) {
		defer wg.Done()
		conn, err := amqp.Dial(url)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		cons, err := amqppub.NewConsumer(conn, &amqppub.ConsumerOptions{Prefetch: 8, RetryDelay: 50 * time.Millisecond, Options: opts})
		if err != nil {
			t.Error(err)
			return
		}
		for batch := 0; ; batch++ {
			select {
			case <-stopAll:
				_ = cons.Close()
				return
			default:
			}
			msgs, err := cons.Receive(ctx, 8, 100*time.Millisecond)
			if err != nil {
				t.Errorf("Receive: %v", err)
				return
			}
			if len(msgs) == 0 {
				continue
			}
			if crashAfter > 0 && batch >= crashAfter {
				crashedHolding.Add(int64(len(msgs)))
				_ = conn.Close() // the process dies: the broker requeues what it held
				return
			}
			for _, m := range msgs {
				if p.Settle(t, "message", m.Event, m.Err) {
					_ = cons.Ack(m)
				} else {
					cons.Retry(m)
				}
			}
		}
	}
	// The members that will be killed start first, so that the broker makes them the active
	// consumers of the queues; the steady one waits behind them.
	// The queues fill up first, so that each batch a member receives is full.
	rng := rand.New(rand.NewPCG(18, 5))
	p.Traffic(t, 300, rng)
	time.Sleep(200 * time.Millisecond)
	wg.Add(2)
	go member(3)
	go member(6)
	time.Sleep(300 * time.Millisecond)
	wg.Add(1)
	go member(0)
	wg.Add(1)
	go member(0)
	p.Traffic(t, 150, rng)
	p.WaitApplied(t, 15*time.Second, nil)
	close(stopAll)
	wg.Wait()
	stopRelay()
	p.VerifyCrashed(t, crashedHolding.Load())
}
