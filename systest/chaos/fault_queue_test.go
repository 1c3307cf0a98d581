package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/stockops"
	"github.com/stockres/stock/systest/internal/kit"
)

// faultBroker is an in-process message broker with JetStream's redelivery: a message handed
// to a consumer and not acknowledged within the ack wait is delivered again, behind the
// messages delivered since; a negative ack delivers it again after its delay.
type faultBroker struct {
	mu      sync.Mutex
	seqs    map[string]int64 // "sku/id/type" -> the sequence the relay gave the event
	ready   []*faultMsg
	out     map[*faultMsg]time.Time // delivered, not acknowledged: due again at
	ackWait time.Duration
	acked   int64 // messages acknowledged so far
	h       *faultHarness
}

type faultMsg struct {
	ev        stock.Event
	delivered int
}

func (b *faultBroker) Publish(_ context.Context, ev stock.Event) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ready = append(b.ready, &faultMsg{ev: ev})
	if _, ok := b.seqs[faultEventKey(ev)]; !ok {
		b.seqs[faultEventKey(ev)] = ev.Seq
	}
	return nil
}

// fetch hands over up to n messages.
func (b *faultBroker) fetch(n int) []*faultMsg {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	for m, due := range b.out { // due again: behind what was delivered since
		if now.After(due) {
			delete(b.out, m)
			b.ready = append(b.ready, m)
		}
	}
	n = min(n, len(b.ready))
	got := b.ready[:n:n]
	b.ready = append([]*faultMsg(nil), b.ready[n:]...)
	for _, m := range got {
		m.delivered++
		if m.delivered > 1 {
			b.h.redelivered.Add(1)
		}
		b.out[m] = now.Add(b.ackWait)
	}
	return got
}

func (b *faultBroker) ack(m *faultMsg) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.out, m)
	b.acked++
}

func (b *faultBroker) nak(m *faultMsg, delay time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.out[m] = time.Now().Add(delay)
}

func (b *faultBroker) pending() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.ready) + len(b.out)
}

func (b *faultBroker) acks() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.acked
}

// runQueue runs the publishing relay and two consumers, each started again at once after it
// is killed, until ctx ends.
func (h *faultHarness) runQueue(ctx context.Context) {
	h.broker = &faultBroker{out: map[*faultMsg]time.Time{}, seqs: map[string]int64{}, ackWait: 150 * time.Millisecond, h: h}
	h.seqStore = &faultSeqStore{Store: h.store, h: h, last: map[string]int64{}, lastKey: map[string]string{},
		seen: map[string]bool{}, failed: map[string]string{}}
	rl, err := stockops.NewRelay(h.back, nil, h.broker, &stock.RelayOptions{Poll: 5 * time.Millisecond, MinBackoff: 5 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, Lease: time.Second, Batch: 64})
	require.NoError(h.t, err)
	h.relay.Store(rl)
	var wg sync.WaitGroup
	wg.Go(func() { _ = rl.Run(ctx) })
	for range 2 {
		wg.Go(func() {
			for ctx.Err() == nil {
				var killAt time.Time
				if h.injCtx.Err() == nil {
					killAt = time.Now().Add(50*time.Millisecond + rand.N(250*time.Millisecond))
				}
				h.consumer(ctx, killAt)
			}
		})
	}
	wg.Wait()
}

// consumer consumes until ctx ends or, if killAt is set, until it is killed after killAt: it
// then stops where it is, leaving the messages it holds unacknowledged.
func (h *faultHarness) consumer(ctx context.Context, killAt time.Time) {
	killed := func() bool {
		if killAt.IsZero() || time.Now().Before(killAt) || h.injCtx.Err() != nil {
			return false
		}
		h.fault("consumer-kill")
		return true
	}
	for ctx.Err() == nil {
		msgs := h.broker.fetch(8)
		if len(msgs) == 0 {
			kit.SleepCtx(ctx, 2*time.Millisecond)
			continue
		}
		for _, m := range msgs {
			if killed() {
				return
			}
			h.consumeOne(ctx, m)
			if rand.IntN(4) == 0 && killed() { // applied, not acknowledged
				return
			}
		}
	}
}

// consumeOne applies one message through stock.Consume and acks or naks it as Consume says.
func (h *faultHarness) consumeOne(ctx context.Context, m *faultMsg) {
	ev := m.ev
	if h.ctl == ctlNoOrder {
		ev.Seq = 0 // the broken variant: applied in delivery order
	}
	err := stock.Consume(ctx, h.back, h.seqStore, ev)
	switch {
	case err == nil:
		h.broker.ack(m)
	case errors.Is(err, stock.ErrHeldBack):
		h.broker.nak(m, 10*time.Millisecond)
	case errors.Is(err, stock.ErrInvalid):
		h.broker.ack(m)
		h.unexpectedf("consume %s/%s %s: %v", ev.SKU, ev.ID, ev.Type, err)
	default:
		h.broker.nak(m, 20*time.Millisecond)
	}
}

// drainQueue publishes what is left and consumes until Redis has nothing pending or
// published and the broker nothing to deliver. It consumes one message at a time, each a store
// transaction and a few Redis round trips or more: the backlog the traffic left (thousands of
// events) takes 10s on an idle 2-core machine and several times that on a loaded one, so the
// drain fails when it stops making progress (no message acknowledged, no event applied) for
// stall, not at a fixed deadline; limit only bounds a drain that never ends.
func (h *faultHarness) drainQueue(ctx context.Context) {
	rl := h.relay.Load()
	stall, limit := 30*time.Second, 5*time.Minute
	if os.Getenv(kit.FaultEnvLong) == "1" {
		limit = 10 * time.Minute // five times the traffic, twice the clients: a deeper queue to drain
	}
	began := time.Now()
	progressAt, acked, unapplied := began, int64(-1), int64(-1)
	for {
		st, err := rl.Once(ctx)
		for _, m := range h.broker.fetch(64) {
			h.consumeOne(ctx, m)
		}
		pending, published := h.outboxes(ctx, ":o"), h.outboxes(ctx, ":p")
		if err == nil && st.Claimed == 0 && pending == 0 && published == 0 && h.broker.pending() == 0 {
			return
		}
		if a := h.broker.acks(); a > acked {
			progressAt, acked = time.Now(), a
		}
		if u := pending + published; pending >= 0 && published >= 0 && (unapplied < 0 || u < unapplied) {
			progressAt, unapplied = time.Now(), u
		}
		if time.Since(progressAt) > stall || time.Since(began) > limit {
			h.t.Errorf("the queue did not drain: %v since the drain began, the last %v of it with no message acknowledged and no event applied "+
				"(last relay error %v, %d events pending, %d published, %d messages in the broker)",
				time.Since(began).Round(time.Millisecond), time.Since(progressAt).Round(time.Millisecond), err, pending, published, h.broker.pending())
			// Why: what Consume says of one message of each item (through the consumers'
			// store, which keeps count of the order it applies events in).
			seen := map[string]bool{}
			for _, m := range h.broker.fetch(h.broker.pending()) {
				if !seen[m.ev.SKU] {
					seen[m.ev.SKU] = true
					h.t.Logf("%s: consume %+v: %v", m.ev.SKU, m.ev, stock.Consume(ctx, h.back, h.seqStore, m.ev))
				}
			}
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func faultEventKey(ev stock.Event) string { return ev.SKU + "/" + ev.ID + "/" + string(ev.Type) }

// faultSeqStore is the consumers' store in queue scenarios: it counts the events whose first
// application comes after a later event of their item (by the sequence the relay gave them).
// It applies one event at a time, so that the order it sees is the store's, and each to the
// end: the consumers' context ends when the traffic does, and an Apply it cut short may have
// committed anyway (the commit on its way when the driver gave up waiting), visible to others a
// moment after the error came back. Counted as not applied, that event's first application
// would seem to come when its message is delivered again, after later events of its item (a
// reconcile pass may have settled it in Redis meanwhile, so that no Consume applies it first).
type faultSeqStore struct {
	stock.Store
	h        *faultHarness
	mu       sync.Mutex
	last     map[string]int64  // sku -> highest sequence applied
	lastKey  map[string]string // sku -> the event of that sequence
	seen     map[string]bool   // events applied
	failed   map[string]string // events whose Apply failed, not applied: the last error
	outOrder []string          // the first events applied out of order, and what came before them
}

func (s *faultSeqStore) Apply(ctx context.Context, ev stock.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.Store.Apply(context.WithoutCancel(ctx), ev)
	key := faultEventKey(ev)
	if err != nil && !errors.Is(err, stock.ErrRefused) && !s.took(ev) {
		s.failed[key] = err.Error()
		return err // not applied (an error after the commit did apply it)
	}
	if s.seen[key] || ev.Type == stock.EventHeld || ev.Type == stock.EventCancelled || ev.Type == stock.EventExpired {
		return err
	}
	s.seen[key] = true
	s.h.broker.mu.Lock()
	seq := s.h.broker.seqs[key]
	s.h.broker.mu.Unlock()
	if ev.Seq > 0 {
		seq = ev.Seq
	}
	if seq < s.last[ev.SKU] {
		s.h.outOfOrder.Add(1)
		if len(s.outOrder) < 5 {
			d := fmt.Sprintf("%s (seq %d) after %s (seq %d)", key, seq, s.lastKey[ev.SKU], s.last[ev.SKU])
			if f := s.failed[key]; f != "" {
				d += fmt.Sprintf(" (an earlier Apply of it failed: %s)", f)
			}
			s.outOrder = append(s.outOrder, d)
		}
	} else {
		s.last[ev.SKU], s.lastKey[ev.SKU] = seq, key
	}
	return err
}

// took reports whether the store has ev's effect, after an Apply that failed.
func (s *faultSeqStore) took(ev stock.Event) bool {
	recs, err := s.Store.Records(context.Background(), ev.SKU, []string{ev.ID})
	if err != nil {
		return false
	}
	rec, ok := recs[ev.ID]
	switch ev.Type {
	case stock.EventDeducted, stock.EventConfirmed, stock.EventRestocked:
		return ok && rec.Type == ev.Type
	case stock.EventRestored, stock.EventRefused:
		return ok && rec.Status != stock.StateApplied
	}
	return false
}
