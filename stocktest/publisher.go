package stocktest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockres/stock"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// A Delivery is one message a Consumer received from the queue.
type Delivery interface {
	// Event returns the event the message carries, decoded as the adapter's consumer side
	// decodes it; an error if it does not decode.
	Event() (stock.Event, error)
	// Ack settles the message: the queue must not deliver it again.
	Ack(ctx context.Context) error
	// Retry asks the queue to deliver the message again later (a negative acknowledgement
	// with a short delay), as a consumer does when stock.Consume answers stock.ErrHeldBack.
	Retry(ctx context.Context) error
}

// A Consumer is one member of a group of consumers that share what the publisher under test
// published: each message goes to one member at a time.
type Consumer interface {
	// Receive returns the next messages for this member, at most max of them, waiting up to
	// wait for the first; none if nothing came in that time.
	Receive(ctx context.Context, max int, wait time.Duration) ([]Delivery, error)
	// Crash ends the member as a process killed by SIGKILL would end: it settles nothing of
	// what it holds, and stops receiving. The queue must deliver every message the member
	// received and did not acknowledge again, to the other members, within
	// PublisherPair.Redelivery.
	Crash()
}

// PublisherPair is what TestPublisher tests: a publisher and the consumer side of one queue.
type PublisherPair struct {
	// Publisher publishes to the queue. If it is a stock.BatchPublisher, the relay of the
	// tests publishes through PublishBatch.
	Publisher stock.Publisher
	// NewConsumer starts a new member of the consumer group. A member started after events
	// were published must receive them (the group, or the queues, exist when the pair is
	// made).
	NewConsumer func(t testing.TB) Consumer
	// Redelivery bounds how long the queue takes to deliver again a message that a crashed
	// member held or that a member asked to Retry. The suite waits several times as long
	// before it gives up, and waits this long to see that an acknowledged message does not
	// come back. Keep it short in tests (a second or so); 0 means one second.
	Redelivery time.Duration
	// NewStore, if set, returns the empty store (implementing Loader) the events are applied
	// to through stock.Consume, as the adapter's consumers would in production. The default
	// is a memstore.
	NewStore func(t testing.TB) stock.Store
}

// TestPublisher checks that a publisher and its consumer side, as newPair makes them, deliver
// stock events as the queue path of package stock needs (Reserver → Relay with no store →
// Publisher → queue → consumer → stock.Consume → Store), in one subtest per property.
// newPair is called once per subtest, must return a pair on a fresh queue (or one that
// nothing else uses), and should register clean-up with t.Cleanup.
//
// The properties checked:
//
//   - AtLeastOnce: every event the publisher accepted reaches a consumer that starts after
//     it was published, with its fields intact (type, SKU, id, user, quantity, time,
//     sequence), and an event published twice is handed over at least once.
//   - OrderAfterCrash: a consumer killed while it holds an item's event unacknowledged does
//     not lose it: the queue delivers it again to the next consumer, possibly after the
//     item's later events, and through stock.Consume the store still gets the item's events
//     in order (a restore before the deduct that bought the unit it gave back).
//   - CrashesKeepOrder: the same with several items, many events and consumers killed one
//     after the other while holding messages: the store ends equal to Redis, refusing no
//     valid sale.
//   - ExactlyOnceInEffect: with every event published twice (a relay that died before its
//     ack) and consumers killed on the way, each event is applied to the store once, the
//     refusals of a store that has fewer units than Redis are given back once, the store
//     ends equal to Redis, and an acknowledged message is not delivered again.
func TestPublisher(t *testing.T, newPair func(t *testing.T) PublisherPair) {
	t.Helper()
	for _, c := range publisherChecks {
		t.Run(c.name, func(t *testing.T) {
			c.run(t, newPubRig(t, newPair(t)))
		})
	}
}

// publisherCheck is one property TestPublisher checks.
type publisherCheck struct {
	name string
	run  func(t testing.TB, rg *pubRig)
}

var publisherChecks = []publisherCheck{
	{"AtLeastOnce", checkAtLeastOnce},
	{"OrderAfterCrash", checkOrderAfterCrash},
	{"CrashesKeepOrder", checkCrashesKeepOrder},
	{"ExactlyOnceInEffect", checkExactlyOnce},
}

// pubRig is the queue path of one check: a Reserver on miniredis, a relay with no store into
// the publisher under test, and a store the consumers apply to.
type pubRig struct {
	t     testing.TB
	env   *Env
	pair  PublisherPair
	relay *stockops.Relay
	store stock.Store
	wait  time.Duration

	mu   sync.Mutex
	seen map[string]int // deliveries per event key
	log  []string       // "<type> <id> <seq>" of each delivery, in order
}

func newPubRig(t testing.TB, pair PublisherPair) *pubRig {
	t.Helper()
	if pair.Publisher == nil || pair.NewConsumer == nil {
		t.Fatalf("stocktest: PublisherPair needs a Publisher and NewConsumer")
	}
	if pair.Redelivery <= 0 {
		pair.Redelivery = time.Second
	}
	env := New(t)
	var store stock.Store = memstore.New()
	if pair.NewStore != nil {
		store = pair.NewStore(t)
	}
	if _, ok := store.(Loader); !ok {
		t.Fatalf("stocktest: %T does not implement stocktest.Loader", store)
	}
	return &pubRig{t: t, env: env, pair: pair, store: store, wait: 20*pair.Redelivery + 3*time.Second, seen: map[string]int{}}
}

func key(ev stock.Event) string { return ev.SKU + "/" + ev.ID + "/" + string(ev.Type) }

// load loads sku with qty units in Redis and in the store.
func (rg *pubRig) load(sku string, qty int64) {
	rg.t.Helper()
	ctx := context.Background()
	if err := rg.env.Reserver.Load(ctx, sku, qty); err != nil {
		rg.t.Fatalf("Load(%q) in Redis: %v", sku, err)
	}
	if err := rg.store.(Loader).Load(ctx, sku, qty); err != nil {
		rg.t.Fatalf("Load(%q) in the store: %v", sku, err)
	}
}

func (rg *pubRig) deduct(sku, id string) {
	rg.t.Helper()
	if _, err := rg.env.Reserver.Deduct(context.Background(), stock.Request{SKU: sku, ID: id, User: "u-" + id, Qty: 1}); err != nil {
		rg.t.Fatalf("Deduct(%s/%s): %v", sku, id, err)
	}
}

func (rg *pubRig) restore(sku, id string) {
	rg.t.Helper()
	if _, err := rg.env.Reserver.Restore(context.Background(), sku, id); err != nil {
		rg.t.Fatalf("Restore(%s/%s): %v", sku, id, err)
	}
}

// publish runs relay passes until the outboxes are empty: every event is published. A failed
// pass (the publisher returned an error) is run again after the backoff.
func (rg *pubRig) publish() {
	rg.t.Helper()
	deadline := time.Now().Add(rg.wait)
	for time.Now().Before(deadline) {
		st, err := rg.relay.Once(context.Background())
		if err != nil {
			rg.t.Logf("relay pass: %v (tried again)", err)
			rg.env.Advance(2 * time.Minute) // past any backoff
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if st.Claimed == 0 {
			return
		}
	}
	rg.t.Fatalf("the relay did not publish every event within %v", rg.wait)
}

// pending counts the events of skus Redis still has to publish or to see applied.
func (rg *pubRig) pending(skus []string) int64 {
	rg.t.Helper()
	var n int64
	for _, sku := range skus {
		for _, sfx := range []string{":o", ":p", ":dl"} {
			c, err := rg.env.Client.Do(context.Background(), rg.env.Client.B().Zcard().Key("stock:{"+sku+"}"+sfx).Build()).AsInt64()
			if err != nil {
				rg.t.Fatalf("stocktest: read Redis: %v", err)
			}
			n += c
		}
	}
	return n
}

// handle applies the deliveries through stock.Consume and settles each as a consumer must.
// It stops early, holding the rest unsettled, when stop says so (called before each).
func (rg *pubRig) handle(ds []Delivery, stop func(ev stock.Event) bool) (held bool) {
	rg.t.Helper()
	ctx := context.Background()
	for _, d := range ds {
		ev, err := d.Event()
		if err != nil {
			rg.t.Fatalf("a delivered message does not decode: %v", err)
		}
		if stop != nil && stop(ev) {
			return true
		}
		rg.mu.Lock()
		rg.seen[key(ev)]++
		rg.log = append(rg.log, fmt.Sprintf("%s %s %d", ev.Type, ev.ID, ev.Seq))
		rg.mu.Unlock()
		switch err := stock.Consume(ctx, rg.env.Reserver, rg.store, ev); {
		case err == nil:
			if err := d.Ack(ctx); err != nil {
				rg.t.Logf("ack %s: %v", key(ev), err)
			}
		case errors.Is(err, stock.ErrInvalid):
			rg.t.Fatalf("stock.Consume(%s seq %d) = %v: the event arrived changed", key(ev), ev.Seq, err)
		default:
			if err := d.Retry(ctx); err != nil {
				rg.t.Logf("retry %s: %v", key(ev), err)
			}
		}
	}
	return false
}

// consume runs c until done, or fails the test after the rig's wait.
func (rg *pubRig) consume(c Consumer, what string, done func() bool) {
	rg.t.Helper()
	deadline := time.Now().Add(rg.wait)
	for !done() {
		if time.Now().After(deadline) {
			rg.t.Fatalf("%s: not done within %v; deliveries: %s", what, rg.wait, rg.deliveries())
		}
		ds, err := c.Receive(context.Background(), 16, 200*time.Millisecond)
		if err != nil {
			rg.t.Logf("receive: %v", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		rg.handle(ds, nil)
	}
}

func (rg *pubRig) deliveries() string {
	rg.mu.Lock()
	defer rg.mu.Unlock()
	return strings.Join(rg.log, ", ")
}

func (rg *pubRig) count(ev stock.Event) int {
	rg.mu.Lock()
	defer rg.mu.Unlock()
	return rg.seen[key(ev)]
}

// settledAndSeen is done when Redis has nothing left to publish or to see applied for skus and
// every event rp accepted was delivered. It runs a relay pass first, as a live relay would
// (publishing the refusals that Consume queues).
func (rg *pubRig) settledAndSeen(skus []string, rp *recordingPublisher) func() bool {
	return func() bool {
		if _, err := rg.relay.Once(context.Background()); err != nil {
			rg.t.Logf("relay pass: %v", err)
			rg.env.Advance(2 * time.Minute)
		}
		for _, ev := range rp.published() {
			if rg.count(ev) == 0 {
				return false
			}
		}
		return rg.pending(skus) == 0
	}
}

// equal fails the test unless the store and Redis agree on every item, and the store recorded
// no refusal.
func (rg *pubRig) equal(skus []string) {
	rg.t.Helper()
	ctx := context.Background()
	for _, sku := range skus {
		l, err := rg.env.Reserver.Levels(ctx, sku)
		if err != nil {
			rg.t.Fatalf("Levels(%q): %v", sku, err)
		}
		rem, err := rg.store.Remaining(ctx, sku)
		if err != nil {
			rg.t.Fatalf("store Remaining(%q): %v", sku, err)
		}
		if rem != l.Available {
			rg.t.Fatalf("%s: the store has %d units, Redis %d: an event was lost, applied twice or out of order; deliveries: %s",
				sku, rem, l.Available, rg.deliveries())
		}
	}
}

// wantStatus fails the test unless the store recorded id of sku with the status.
func (rg *pubRig) wantStatus(sku, id string, want stock.State) {
	rg.t.Helper()
	m, err := rg.store.Records(context.Background(), sku, []string{id})
	if err != nil {
		rg.t.Fatalf("Records(%q): %v", sku, err)
	}
	if got, ok := m[id]; !ok || got.Status != want {
		rg.t.Fatalf("the store's record of %s/%s = %+v (found %v), want status %s; deliveries: %s", sku, id, got, ok, want, rg.deliveries())
	}
}

// recordingPublisher records the events the publisher under test accepted: what the
// consumers must get.
type recordingPublisher struct {
	inner stock.Publisher
	mu    sync.Mutex
	evs   []stock.Event
}

// Publish publishes through the publisher under test and records ev if it was accepted.
func (p *recordingPublisher) Publish(ctx context.Context, ev stock.Event) error {
	err := p.inner.Publish(ctx, ev)
	if err == nil {
		p.mu.Lock()
		p.evs = append(p.evs, ev)
		p.mu.Unlock()
	}
	return err
}

// PublishBatch publishes through the publisher under test (one by one if it has no
// PublishBatch) and records the events it accepted.
func (p *recordingPublisher) PublishBatch(ctx context.Context, evs []stock.Event) []error {
	bp, ok := p.inner.(stock.BatchPublisher)
	var errs []error
	if ok {
		errs = bp.PublishBatch(ctx, evs)
	} else {
		errs = make([]error, len(evs))
		for i, ev := range evs {
			errs[i] = p.inner.Publish(ctx, ev)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, err := range errs {
		if err == nil && i < len(evs) {
			p.evs = append(p.evs, evs[i])
		}
	}
	return errs
}

func (p *recordingPublisher) published() []stock.Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]stock.Event(nil), p.evs...)
}

// recorded makes the rig's relay publish through a recordingPublisher and returns it.
func (rg *pubRig) recorded() *recordingPublisher {
	rg.t.Helper()
	rp := &recordingPublisher{inner: rg.pair.Publisher}
	var pub stock.Publisher = rp
	if _, ok := rg.pair.Publisher.(stock.BatchPublisher); !ok {
		pub = stock.PublisherFunc(rp.Publish) // keep the publisher's own shape
	}
	rl, err := stockops.NewRelay(rg.env.Reserver, nil, pub, &stock.RelayOptions{Batch: 16})
	if err != nil {
		rg.t.Fatalf("stocktest: NewRelay: %v", err)
	}
	rg.relay = rl
	return rp
}

func checkAtLeastOnce(t testing.TB, rg *pubRig) {
	rp := rg.recorded()
	skus := []string{"alo-1", "alo/2.x*>%:é", "alo-3"} // a SKU with characters queues give a meaning
	for _, sku := range skus {
		rg.load(sku, 100)
	}
	for i := range 20 {
		sku := skus[i%len(skus)]
		id := fmt.Sprintf("o%d", i)
		rg.deduct(sku, id)
		if i%4 == 0 {
			rg.restore(sku, id)
		}
	}
	if _, err := rg.env.Reserver.Restock(context.Background(), skus[0], "r1", 5); err != nil {
		t.Fatalf("Restock: %v", err)
	}
	rg.publish()
	evs := rp.published()
	if len(evs) == 0 {
		t.Fatal("the relay published nothing")
	}
	// One event published a second time, directly: at least once, not at most once.
	if err := rg.pair.Publisher.Publish(context.Background(), evs[0]); err != nil {
		t.Fatalf("Publish of a repeat: %v", err)
	}
	byKey := map[string]stock.Event{}
	for _, ev := range evs {
		byKey[key(ev)] = ev
	}
	c := rg.pair.NewConsumer(t)
	got := map[string]stock.Event{}
	deadline := time.Now().Add(rg.wait)
	for len(got) < len(byKey) {
		if time.Now().After(deadline) {
			var missing []string
			for k := range byKey {
				if _, ok := got[k]; !ok {
					missing = append(missing, k)
				}
			}
			t.Fatalf("%d of %d published events never delivered: %v", len(missing), len(byKey), missing)
		}
		ds, err := c.Receive(context.Background(), 16, 200*time.Millisecond)
		if err != nil {
			t.Logf("receive: %v", err)
			continue
		}
		for _, d := range ds {
			ev, err := d.Event()
			if err != nil {
				t.Fatalf("a delivered message does not decode: %v", err)
			}
			want, ok := byKey[key(ev)]
			if !ok {
				t.Fatalf("delivered %s, which was never published", key(ev))
			}
			if ev.Type != want.Type || ev.SKU != want.SKU || ev.ID != want.ID || ev.User != want.User ||
				ev.Qty != want.Qty || !ev.At.Equal(want.At) || ev.Seq != want.Seq {
				t.Fatalf("delivered %+v, published %+v", ev, want)
			}
			got[key(ev)] = ev
			if err := d.Ack(context.Background()); err != nil {
				t.Logf("ack: %v", err)
			}
		}
	}
}

// checkOrderAfterCrash: one unit; deduct a, restore a, deduct b. The first consumer applies
// D(a), takes R(a) and is killed before it settles it; the next consumer must get R(a) again,
// and the store must end with a restored and b applied (not refused: that would mean D(b)
// reached it before R(a)).
func checkOrderAfterCrash(t testing.TB, rg *pubRig) {
	rp := rg.recorded()
	sku := "one"
	rg.load(sku, 1)
	rg.deduct(sku, "a")
	rg.restore(sku, "a")
	rg.deduct(sku, "b")
	rg.publish()
	evs := rp.published()
	if len(evs) != 3 {
		t.Fatalf("the relay published %d events, want 3", len(evs))
	}
	first := rg.pair.NewConsumer(t)
	var heldRA bool
	deadline := time.Now().Add(rg.wait)
	for !heldRA {
		if time.Now().After(deadline) {
			t.Fatalf("the first consumer never received R(a); deliveries: %s", rg.deliveries())
		}
		// Two at a time, so that D(b) is likely still in the queue when the consumer dies:
		// a queue that redelivers after later messages then hands D(b) over before R(a).
		ds, err := first.Receive(context.Background(), 2, 200*time.Millisecond)
		if err != nil {
			continue
		}
		heldRA = rg.handle(ds, func(ev stock.Event) bool { return ev.Type == stock.EventRestored })
	}
	first.Crash()
	before := rg.count(evs[1])
	second := rg.pair.NewConsumer(t)
	rg.consume(second, "the next consumer", func() bool {
		return rg.count(evs[1]) > before && rg.count(evs[2]) > 0 && rg.pending([]string{sku}) == 0
	})
	rg.wantStatus(sku, "a", stock.StateRestored)
	rg.wantStatus(sku, "b", stock.StateApplied)
	rg.equal([]string{sku})
	if l, err := rg.env.Reserver.Levels(context.Background(), sku); err != nil || l.Available != 0 {
		t.Fatalf("Levels(%q) = %+v, %v; want 0 available: b's sale was given back", sku, l, err)
	}
	t.Logf("deliveries: %s", rg.deliveries())
}

// crashRun runs consumers one after the other, each killed after handling some messages while
// it holds others, then one that finishes.
func (rg *pubRig) crashRun(skus []string, rp *recordingPublisher, kills int) (last Consumer) {
	rg.t.Helper()
	for k := range kills {
		c := rg.pair.NewConsumer(rg.t)
		handled := 0
		limit := 3 + 2*k
		deadline := time.Now().Add(rg.wait)
		for held := false; !held; {
			if time.Now().After(deadline) {
				break // nothing left to hold: the queue delivered everything
			}
			ds, err := c.Receive(context.Background(), 4, 200*time.Millisecond)
			if err != nil {
				continue
			}
			if len(ds) == 0 && rg.settledAndSeen(skus, rp)() {
				break
			}
			held = rg.handle(ds, func(stock.Event) bool { handled++; return handled > limit })
		}
		c.Crash()
	}
	last = rg.pair.NewConsumer(rg.t)
	rg.consume(last, "the last consumer", rg.settledAndSeen(skus, rp))
	return last
}

// drainQuiet runs c until it receives nothing for quiet, or fails the test after the rig's wait.
func (rg *pubRig) drainQuiet(c Consumer, quiet time.Duration) {
	rg.t.Helper()
	deadline := time.Now().Add(rg.wait)
	for lastSeen := time.Now(); time.Since(lastSeen) < quiet; {
		if time.Now().After(deadline) {
			rg.t.Fatalf("messages still delivered %v after the last consumer started; deliveries: %s", rg.wait, rg.deliveries())
		}
		ds, err := c.Receive(context.Background(), 16, 200*time.Millisecond)
		if err != nil || len(ds) == 0 {
			continue
		}
		lastSeen = time.Now()
		rg.handle(ds, nil)
	}
}

func checkCrashesKeepOrder(t testing.TB, rg *pubRig) {
	rp := rg.recorded()
	skus := []string{"k0", "k1", "k2"}
	for _, sku := range skus {
		rg.load(sku, 2)
	}
	// At the edge of the stock: each sale after the second needs a restore before it.
	for i := range 8 {
		for _, sku := range skus {
			id := fmt.Sprintf("o%d", i)
			rg.deduct(sku, id)
			if i%2 == 1 {
				rg.restore(sku, id)
				rg.restore(sku, fmt.Sprintf("o%d", i-1))
			}
		}
	}
	rg.publish()
	rg.crashRun(skus, rp, 3)
	rg.equal(skus)
	for _, sku := range skus {
		for i := range 8 {
			rg.wantStatus(sku, fmt.Sprintf("o%d", i), stock.StateRestored)
		}
	}
}

func checkExactlyOnce(t testing.TB, rg *pubRig) {
	rp := rg.recorded()
	ctx := context.Background()
	skus := []string{"x0", "x1"}
	// Redis has 6 units of x1, the store 4: two sales are refused and given back.
	rg.load(skus[0], 10)
	if err := rg.env.Reserver.Load(ctx, skus[1], 6); err != nil {
		t.Fatal(err)
	}
	if err := rg.store.(Loader).Load(ctx, skus[1], 4); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		for _, sku := range skus {
			rg.deduct(sku, fmt.Sprintf("o%d", i))
		}
	}
	rg.restore(skus[0], "o0")
	rg.publish()
	evs := rp.published()
	// Every event published a second time, as by a relay that died before its ack.
	for _, ev := range evs {
		if err := rg.pair.Publisher.Publish(ctx, ev); err != nil {
			t.Fatalf("Publish of a repeat: %v", err)
		}
	}
	last := rg.crashRun(skus, rp, 2)
	if ms, ok := rg.store.(*memstore.Store); ok && ms.MaxApplications() != 1 {
		t.Fatalf("the store applied an event %d times", ms.MaxApplications())
	}
	refused := 0
	for i := range 6 {
		m, err := rg.store.Records(ctx, skus[1], []string{fmt.Sprintf("o%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range m {
			if rec.Status == stock.StateRefused {
				refused++
			}
		}
	}
	if refused != 2 {
		t.Fatalf("the store refused %d sales of %s, want 2", refused, skus[1])
	}
	rg.equal(skus[:1])
	// The store sold its 4 units and refused 2 sales, which Redis gave back once each.
	l, err := rg.env.Reserver.Levels(ctx, skus[1])
	if err != nil || l.Available != 2 {
		t.Fatalf("Levels(%q) = %+v, %v; want 2 available: the 2 refused sales given back once each", skus[1], l, err)
	}
	if rem, err := rg.store.Remaining(ctx, skus[1]); err != nil || rem != 0 {
		t.Fatalf("store Remaining(%q) = %d, %v; want 0", skus[1], rem, err)
	}
	// Every copy is handled before the check: when each event has been seen once, the repeats
	// and the crashed consumers' redeliveries may still be queued (a loaded machine is slow to
	// claim them back). The last consumer takes what comes until the queue is quiet for a
	// redelivery period; a broker whose acks do not hold never goes quiet.
	rg.drainQuiet(last, rg.pair.Redelivery+time.Second)
	// An acknowledged message does not come back: a member started now gets nothing.
	c := rg.pair.NewConsumer(t)
	deadline := time.Now().Add(rg.pair.Redelivery + time.Second)
	for time.Now().Before(deadline) {
		ds, err := c.Receive(ctx, 16, 200*time.Millisecond)
		if err != nil {
			continue
		}
		for _, d := range ds {
			ev, _ := d.Event()
			t.Fatalf("%s delivered again after every message was acknowledged", key(ev))
		}
	}
}
