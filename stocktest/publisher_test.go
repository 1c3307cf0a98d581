package stocktest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockres/stock"
	"github.com/stockres/stock/stocktest"
)

// --- TestPublisher against an in-memory queue, correct and broken --------------------------

type fakeMsg struct {
	ev      stock.Event
	owner   *fakeConsumer
	acked   bool
	visible time.Time
}

// fakeQueue is an in-memory queue with one consumer group. mode breaks it on purpose:
// "drop" accepts every third event without keeping it; "lose-on-crash" drops the messages a
// crashed member held; "ack-ignored" delivers acknowledged messages again.
type fakeQueue struct {
	mode string
	mu   sync.Mutex
	msgs []*fakeMsg
	n    int
}

func (q *fakeQueue) Publish(_ context.Context, ev stock.Event) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.n++
	if q.mode == "drop" && q.n%3 == 0 {
		return nil
	}
	q.msgs = append(q.msgs, &fakeMsg{ev: ev})
	return nil
}

type fakeConsumer struct {
	q    *fakeQueue
	dead atomic.Bool
}

type fakeDelivery struct {
	c *fakeConsumer
	m *fakeMsg
}

func (d fakeDelivery) Event() (stock.Event, error) { return d.m.ev, nil }
func (d fakeDelivery) Ack(context.Context) error {
	d.c.q.mu.Lock()
	defer d.c.q.mu.Unlock()
	if d.m.owner != d.c {
		return errors.New("not the owner")
	}
	if d.c.q.mode == "ack-ignored" {
		d.m.owner, d.m.visible = nil, time.Now().Add(100*time.Millisecond)
		return nil
	}
	d.m.acked, d.m.owner = true, nil
	return nil
}
func (d fakeDelivery) Retry(context.Context) error {
	d.c.q.mu.Lock()
	defer d.c.q.mu.Unlock()
	if d.m.owner == d.c {
		d.m.owner, d.m.visible = nil, time.Now().Add(100*time.Millisecond)
	}
	return nil
}

func (c *fakeConsumer) Receive(ctx context.Context, max int, wait time.Duration) ([]Delivery, error) {
	deadline := time.Now().Add(wait)
	for {
		if c.dead.Load() {
			return nil, errors.New("crashed")
		}
		c.q.mu.Lock()
		var out []Delivery
		now := time.Now()
		for _, m := range c.q.msgs {
			if len(out) == max {
				break
			}
			if !m.acked && m.owner == nil && !m.visible.After(now) {
				m.owner = c
				out = append(out, fakeDelivery{c, m})
			}
		}
		c.q.mu.Unlock()
		if len(out) > 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return out, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (c *fakeConsumer) Crash() {
	c.dead.Store(true)
	c.q.mu.Lock()
	defer c.q.mu.Unlock()
	for _, m := range c.q.msgs {
		if m.owner == c {
			m.owner = nil
			if c.q.mode == "lose-on-crash" {
				m.acked = true // gone
			}
		}
	}
}

// Delivery is stocktest.Delivery, named here for the fake consumer.
type Delivery = stocktest.Delivery

// TestPublisherSuiteChild runs stocktest.TestPublisher on a fakeQueue of the mode
// STOCKTEST_CHILD_QUEUE names; it is run by TestPublisherSuiteOnQueues in a child process, and
// skips otherwise.
func TestPublisherSuiteChild(t *testing.T) {
	mode := os.Getenv("STOCKTEST_CHILD_QUEUE")
	if mode == "" {
		t.Skip("run by TestPublisherSuiteOnQueues in a child process")
	}
	stocktest.TestPublisher(t, func(t *testing.T) stocktest.PublisherPair {
		q := &fakeQueue{mode: mode}
		return stocktest.PublisherPair{
			Publisher:   q,
			NewConsumer: func(testing.TB) stocktest.Consumer { return &fakeConsumer{q: q} },
			Redelivery:  300 * time.Millisecond,
		}
	})
}

// publisherSuiteChild runs TestPublisher on the queue mode in a child test process.
func publisherSuiteChild(t *testing.T, mode string) (failed bool, out string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestPublisherSuiteChild$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "STOCKTEST_CHILD_QUEUE="+mode)
	b, err := cmd.CombinedOutput()
	out = string(b)
	if ctx.Err() != nil {
		t.Fatalf("child for %s timed out:\n%s", mode, tail(out, 40))
	}
	if strings.Contains(out, "panic:") || strings.Contains(out, "no tests to run") {
		t.Fatalf("child for %s did not run the suite cleanly:\n%s", mode, tail(out, 60))
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("child for %s: %v", mode, err)
	}
	return err != nil, out
}

// TestPublisherSuiteOnQueues: stocktest.TestPublisher passes a correct in-memory queue and
// fails, in the named subtest, queues broken on purpose (the broken ones only outside -short).
func TestPublisherSuiteOnQueues(t *testing.T) {
	t.Run("correct", func(t *testing.T) {
		t.Parallel()
		if failed, out := publisherSuiteChild(t, "correct"); failed {
			t.Fatalf("TestPublisher fails a correct in-memory queue:\n%s", tail(out, 60))
		}
	})
	for mode, wantFail := range map[string]string{
		"drop":          "AtLeastOnce",
		"lose-on-crash": "OrderAfterCrash",
		"ack-ignored":   "ExactlyOnceInEffect",
	} {
		t.Run(mode, func(t *testing.T) {
			if testing.Short() {
				t.Skip("-short: a broken queue's child run waits out TestPublisher's timeouts (up to half a minute); TestPublisherChecksCanFail makes the same checks fail in-process, and the full tier runs this")
			}
			t.Parallel()
			failed, out := publisherSuiteChild(t, mode)
			if !failed {
				t.Fatalf("TestPublisher passed a queue broken on purpose (%s):\n%s", mode, tail(out, 40))
			}
			if !strings.Contains(out, "--- FAIL: TestPublisherSuiteChild/"+wantFail+" ") {
				t.Fatalf("queue %s: subtest %s did not fail:\n%s", mode, wantFail, tail(out, 60))
			}
		})
	}
}
