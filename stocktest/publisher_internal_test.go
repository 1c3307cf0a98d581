package stocktest

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stockres/stock"
)

// memQueue is an in-memory queue with one consumer group: a message goes to one member at a
// time; one that was not acknowledged (retried, or held by a crashed member) goes to the back
// of the queue, after the messages published since. Its knobs break it on purpose.
type memQueue struct {
	mu       sync.Mutex
	ready    [][]byte
	inflight map[*memDelivery]*memConsumer
	n        int

	dropEvery  int                              // Publish drops every n-th event and answers nil
	mangle     func(ev stock.Event) stock.Event // applied to each event published
	crashLoses bool                             // a crashed member's messages are lost
	ackKeeps   bool                             // Ack puts the message back, as Retry does
}

func newMemQueue() *memQueue { return &memQueue{inflight: map[*memDelivery]*memConsumer{}} }

func (q *memQueue) Publish(_ context.Context, ev stock.Event) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.n++
	if q.dropEvery > 0 && q.n%q.dropEvery == 0 {
		return nil
	}
	if q.mangle != nil {
		ev = q.mangle(ev)
	}
	data, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	q.ready = append(q.ready, data)
	return nil
}

func (q *memQueue) pair(*testing.T) PublisherPair {
	return PublisherPair{
		Publisher:   q,
		NewConsumer: func(testing.TB) Consumer { return &memConsumer{q: q} },
		Redelivery:  50 * time.Millisecond,
	}
}

type memConsumer struct {
	q    *memQueue
	dead bool
}

type memDelivery struct {
	q    *memQueue
	data []byte
}

func (d *memDelivery) Event() (stock.Event, error) {
	var ev stock.Event
	err := json.Unmarshal(d.data, &ev)
	return ev, err
}

func (d *memDelivery) settle(back bool) {
	d.q.mu.Lock()
	defer d.q.mu.Unlock()
	if _, ok := d.q.inflight[d]; !ok {
		return
	}
	delete(d.q.inflight, d)
	if back {
		d.q.ready = append(d.q.ready, d.data)
	}
}

func (d *memDelivery) Ack(context.Context) error   { d.settle(d.q.ackKeeps); return nil }
func (d *memDelivery) Retry(context.Context) error { d.settle(true); return nil }

func (c *memConsumer) Receive(_ context.Context, max int, wait time.Duration) ([]Delivery, error) {
	deadline := time.Now().Add(wait)
	for {
		c.q.mu.Lock()
		if c.dead {
			c.q.mu.Unlock()
			return nil, nil
		}
		n := min(max, len(c.q.ready))
		if n > 0 {
			out := make([]Delivery, n)
			for i := range n {
				d := &memDelivery{q: c.q, data: c.q.ready[i]}
				c.q.inflight[d] = c
				out[i] = d
			}
			c.q.ready = c.q.ready[n:]
			c.q.mu.Unlock()
			return out, nil
		}
		c.q.mu.Unlock()
		if time.Now().After(deadline) {
			return nil, nil
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (c *memConsumer) Crash() {
	c.q.mu.Lock()
	defer c.q.mu.Unlock()
	c.dead = true
	for d, owner := range c.q.inflight {
		if owner == c {
			delete(c.q.inflight, d)
			if !c.q.crashLoses {
				c.q.ready = append(c.q.ready, d.data)
			}
		}
	}
}

// brokenQueues holds, for each check of TestPublisher, a queue that breaks what it checks.
var brokenQueues = map[string]func() *memQueue{
	"AtLeastOnce": func() *memQueue { q := newMemQueue(); q.dropEvery = 5; return q },
	"OrderAfterCrash": func() *memQueue {
		q := newMemQueue()
		q.crashLoses = true
		return q
	},
	"CrashesKeepOrder": func() *memQueue {
		q := newMemQueue()
		q.mangle = func(ev stock.Event) stock.Event { ev.Seq = 0; return ev } // loses the sequence
		return q
	},
	"ExactlyOnceInEffect": func() *memQueue { q := newMemQueue(); q.ackKeeps = true; return q },
}

// MemQueuePair is, for this package's external tests, the pair of a correct memQueue (mode
// "correct") or of the queue brokenQueues holds for the check mode names.
func MemQueuePair(t *testing.T, mode string) PublisherPair {
	if mode == "correct" {
		return newMemQueue().pair(t)
	}
	return brokenQueues[mode]().pair(t)
}

// runPubCheck runs the Publisher check c on q.
func runPubCheck(t *testing.T, c publisherCheck, q *memQueue) (failed bool, msg string) {
	return runChecked(t, c.name, func(tb testing.TB) { c.run(tb, newPubRig(tb, q.pair(t))) })
}

// TestPublisherChecksCanFail: each check of TestPublisher passes on a queue that keeps the
// rules and fails on one that breaks the rule it checks.
func TestPublisherChecksCanFail(t *testing.T) {
	var names []string
	for _, c := range publisherChecks {
		names = append(names, c.name)
	}
	checksCanFail(t, names, func(n string) bool { return brokenQueues[n] != nil }, func(t *testing.T, i int, broken bool) (bool, string) {
		q := newMemQueue()
		if broken {
			q = brokenQueues[names[i]]()
		}
		return runPubCheck(t, publisherChecks[i], q)
	})
	if len(brokenQueues) != len(publisherChecks) {
		t.Fatalf("%d broken queues for %d checks", len(brokenQueues), len(publisherChecks))
	}
}

// TestPublisherOnMemQueue runs TestPublisher itself on a queue that keeps the rules.
func TestPublisherOnMemQueue(t *testing.T) {
	TestPublisher(t, func(t *testing.T) PublisherPair { return newMemQueue().pair(t) })
}
