package streampub_test

// Attack 18 on streampub, through its exported API: batches with a bad event in the middle,
// cancelled contexts, garbage entries in a shard stream, trimming of entries a dead consumer
// still holds, and consumers crashing mid-stream while the relay publishes.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/queuetest"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/stockops"
	"github.com/stockres/stock/streampub"
)

func a18Backends(t *testing.T, f func(t *testing.T, b redistest.Backend)) {
	for _, b := range redistest.Backends(t) {
		if b.Name == "sentinel" {
			continue
		}
		b.DisableCache = true
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			f(t, b)
		})
	}
}

// a18Entries reads every entry of a stream and decodes it.
func a18Entries(t *testing.T, ctx context.Context, c rueidis.Client, stream string) []stock.Event {
	t.Helper()
	res, err := c.Do(ctx, c.B().Xrange().Key(stream).Start("-").End("+").Build()).AsXRange()
	if err != nil {
		t.Fatalf("XRANGE %s: %v", stream, err)
	}
	var out []stock.Event
	for _, e := range res {
		ev, err := streampub.Decode([]byte(e.FieldValues[streampub.Field]))
		if err != nil {
			t.Fatalf("entry %s of %s does not decode: %v", e.ID, stream, err)
		}
		out = append(out, ev)
	}
	return out
}

// A batch of one item with an invalid event in the middle: the doc promises that an error for an
// event means that it and every later event of the same stream in the batch were not appended.
// Another item's events in the same batch (another stream) are unaffected.
func TestAttack18InvalidMidBatchStopsTheStream(t *testing.T) {
	a18Backends(t, func(t *testing.T, b redistest.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		pub, err := streampub.New(c, streampub.WithShards(64))
		if err != nil {
			t.Fatal(err)
		}
		skuA, skuB := "a:1~ü", "b:2"
		if pub.Stream(skuA) == pub.Stream(skuB) {
			t.Fatal("pick SKUs on two shards")
		}
		bad := queuetest.Ev(skuA, "", 2) // no id: invalid
		evs := []stock.Event{queuetest.Ev(skuA, "1", 1), queuetest.Ev(skuB, "1", 1), bad, queuetest.Ev(skuB, "2", 2), queuetest.Ev(skuA, "3", 3)}
		errs := pub.PublishBatch(ctx, evs)
		if len(errs) != len(evs) {
			t.Fatalf("%d answers for %d events", len(errs), len(evs))
		}
		if errs[0] != nil || errs[1] != nil || errs[3] != nil {
			t.Errorf("valid events before the bad one, or of another stream, failed: %v", errs)
		}
		if !errors.Is(errs[2], stock.ErrInvalid) {
			t.Errorf("the invalid event: %v, want ErrInvalid", errs[2])
		}
		gotA := a18Entries(t, ctx, c, pub.Stream(skuA))
		gotB := a18Entries(t, ctx, c, pub.Stream(skuB))
		if len(gotB) != 2 {
			t.Errorf("stream of %q has %d entries, want 2", skuB, len(gotB))
		}
		var idsA []string
		for _, ev := range gotA {
			idsA = append(idsA, ev.ID)
		}
		if errs[4] == nil {
			t.Errorf("the event after the invalid one was answered nil: the item's stream has %v, "+
				"the event after a failure of its stream was appended (out of order)", idsA)
		} else if len(gotA) != 1 {
			t.Errorf("answered %v for the event after the bad one, but the item's stream has %v", errs[4], idsA)
		}
	})
}

// A cancelled context: whatever PublishBatch and Publish answer, an event answered nil must be
// in its stream.
func TestAttack18CancelledContext(t *testing.T) {
	a18Backends(t, func(t *testing.T, b redistest.Backend) {
		c := b.Client(t)
		pub, err := streampub.New(c, streampub.WithShards(4))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		evs := []stock.Event{queuetest.Ev("c", "1", 1), queuetest.Ev("c", "2", 2), queuetest.Ev("d", "1", 1)}
		errs := pub.PublishBatch(ctx, evs)
		if len(errs) != len(evs) {
			t.Fatalf("%d answers for %d events", len(errs), len(evs))
		}
		perr := pub.Publish(ctx, queuetest.Ev("c", "9", 9))
		in := map[string]bool{}
		for _, s := range pub.Streams() {
			for _, ev := range a18Entries(t, context.Background(), c, s) {
				in[ev.SKU+"/"+ev.ID] = true
			}
		}
		for i, ev := range evs {
			if errs[i] == nil && !in[ev.SKU+"/"+ev.ID] {
				t.Errorf("event %s/%s answered nil on a cancelled context, not in its stream", ev.SKU, ev.ID)
			}
		}
		if perr == nil && !in["c/9"] {
			t.Errorf("Publish answered nil on a cancelled context, the event is not in its stream")
		}
	})
}

// Entries that are not events, in a shard stream (another writer, a bug): Receive hands them
// over with Err, the valid ones with their event, and keeps reading the stream.
func TestAttack18GarbageEntries(t *testing.T) {
	a18Backends(t, func(t *testing.T, b redistest.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		pub, err := streampub.New(c, streampub.WithShards(1))
		if err != nil {
			t.Fatal(err)
		}
		if err := streampub.EnsureGroup(ctx, c, "g", pub.Streams()); err != nil {
			t.Fatal(err)
		}
		s := pub.Streams()[0]
		add := func(fv ...string) {
			cmd := c.B().Xadd().Key(s).Id("*").FieldValue()
			for i := 0; i+1 < len(fv); i += 2 {
				cmd = cmd.FieldValue(fv[i], fv[i+1])
			}
			if err := c.Do(ctx, cmd.Build()).Error(); err != nil {
				t.Fatal(err)
			}
		}
		add("other", "x")
		add(streampub.Field, "{not json")
		add(streampub.Field, `{"type":"deducted","sku":"g","id":"1","qty":-5,"at":"2024-01-01T00:00:00Z"}`)
		add(streampub.Field, `{"type":"deducted","sku":"g","id":"2","qty":1,"at":"2024-01-01T00:00:00Z"} {"x":1}`)
		add(streampub.Field, `{"type":"deducted","sku":"g","id":"3","qty":1,"at":"2024-01-01T00:00:00Z"}`, "extra", "y")
		if err := pub.Publish(ctx, queuetest.Ev("g", "4", 4)); err != nil {
			t.Fatal(err)
		}
		cons, err := streampub.NewConsumer(c, "g", "one", pub.Streams(), &streampub.ConsumerOptions{Poll: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		var good, garbage []string
		for i := 0; i < 10 && len(good)+len(garbage) < 6; i++ {
			msgs, err := cons.Receive(ctx, 10, 100*time.Millisecond)
			if err != nil {
				t.Fatalf("Receive: %v", err)
			}
			for _, m := range msgs {
				if m.Err != nil {
					if !errors.Is(m.Err, stock.ErrInvalid) {
						t.Errorf("garbage entry %s: %v, want ErrInvalid", m.ID, m.Err)
					}
					garbage = append(garbage, m.ID)
				} else {
					good = append(good, m.Event.ID)
				}
				if err := cons.Ack(ctx, m); err != nil {
					t.Fatal(err)
				}
			}
		}
		if len(garbage) != 4 || len(good) != 2 {
			t.Errorf("received %d garbage entries and events %v; want 4 garbage and events [3 4]", len(garbage), good)
		}
		pend, err := c.Do(ctx, c.B().Xpending().Key(s).Group("g").Build()).ToArray()
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := pend[0].AsInt64(); n != 0 {
			t.Errorf("%d entries still pending after every one was acknowledged", n)
		}
	})
}

// a18Handle applies msgs through the pipeline's stock.Consume and acknowledges what it settled;
// the rest stays pending, to be claimed again after MinIdle.
func a18Handle(t *testing.T, p *queuetest.Pipeline, cons *streampub.Consumer, msgs []streampub.Message) {
	for _, m := range msgs {
		if p.Settle(t, fmt.Sprintf("entry %s of %s", m.ID, m.Stream), m.Event, m.Err) {
			_ = cons.Ack(context.Background(), m)
		}
	}
}

// A consumer dies holding entries; the streams are trimmed (MAXLEN ~ 5) far past them while it is
// dead; later events of every item follow. Its successor must not be stuck on the trimmed
// entries (XAUTOCLAIM of deleted ids), the group's pending list must empty, and through
// stock.Consume the store must still get every acknowledged operation once: a trimmed event is
// applied from Redis before a later event of its item.
func TestAttack18TrimmedWhilePending(t *testing.T) {
	a18Backends(t, func(t *testing.T, b redistest.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		skus := []string{"t:1", "t~2", "ü:3", "t.4"}
		p := queuetest.NewPipeline(t, c, skus)
		rng := rand.New(rand.NewPCG(18, 1))
		pub, err := streampub.New(c, streampub.WithShards(2), streampub.WithMaxLen(5))
		if err != nil {
			t.Fatal(err)
		}
		if err := streampub.EnsureGroup(ctx, c, "store", pub.Streams()); err != nil {
			t.Fatal(err)
		}
		rl, err := stockops.NewRelay(p.R, nil, pub, nil)
		if err != nil {
			t.Fatal(err)
		}
		p.Traffic(t, 60, rng)
		p.Drain(t, rl)
		opts := &streampub.ConsumerOptions{MinIdle: 300 * time.Millisecond, Poll: 10 * time.Millisecond}
		dead, err := streampub.NewConsumer(c, "store", "dead", pub.Streams(), opts)
		if err != nil {
			t.Fatal(err)
		}
		held, err := dead.Receive(ctx, 1000, time.Second)
		if err != nil || len(held) == 0 {
			t.Fatalf("the first consumer received %d entries (%v)", len(held), err)
		}
		// It dies holding them. Much more traffic trims the streams past them.
		p.Traffic(t, 600, rng)
		p.Drain(t, rl)
		for _, sku := range skus { // one last event per item, kept by any trim
			p.Deduct(t, sku, "last", 1)
		}
		p.Drain(t, rl)
		// The trim reached the dead consumer's entries.
		gone := 0
		for _, m := range held {
			res, err := c.Do(ctx, c.B().Xrange().Key(m.Stream).Start(m.ID).End(m.ID).Build()).AsXRange()
			if err != nil {
				t.Fatal(err)
			}
			if len(res) == 0 {
				gone++
			}
		}
		if gone == 0 {
			t.Fatalf("none of the %d entries the dead consumer holds was trimmed: the attack did not happen", len(held))
		}
		t.Logf("the dead consumer holds %d entries, %d of them trimmed", len(held), gone)
		time.Sleep(400 * time.Millisecond) // past MinIdle for the dead consumer's entries
		redistest.Sleep(c, 400*time.Millisecond)
		next, err := streampub.NewConsumer(c, "store", "next", pub.Streams(), opts)
		if err != nil {
			t.Fatal(err)
		}
		var rerr error
		deadline := time.Now().Add(8 * time.Second)
		quiet := 0
		for time.Now().Before(deadline) && quiet < 3 {
			msgs, err := next.Receive(ctx, 200, 200*time.Millisecond)
			if err != nil {
				rerr = err
			}
			if len(msgs) == 0 {
				quiet++
				continue
			}
			quiet = 0
			a18Handle(t, p, next, msgs)
		}
		if rerr != nil {
			t.Errorf("Receive failed after the trim: %v", rerr)
		}
		for _, s := range pub.Streams() {
			pend, err := c.Do(ctx, c.B().Xpending().Key(s).Group("store").Build()).ToArray()
			if err != nil {
				t.Fatal(err)
			}
			if n, _ := pend[0].AsInt64(); n != 0 {
				t.Errorf("stream %s: %d entries still pending in the group after the drain", s, n)
			}
		}
		p.Verify(t)
	})
}

// Three consumers while the relay publishes and traffic runs; one crashes mid-stream holding
// entries and a new member with the crashed one's name takes over; another crashes and is not
// replaced. The store must end equal to Redis and to the acknowledged answers.
func TestAttack18ConsumersCrashMidStream(t *testing.T) {
	a18Backends(t, func(t *testing.T, b redistest.Backend) {
		ctx := context.Background()
		c := b.Client(t)
		skus := []string{"m:1", "m:2", "m~3", "m:ü4", "m:5", "m:6"}
		p := queuetest.NewPipeline(t, c, skus)
		pub, err := streampub.New(c, streampub.WithShards(3))
		if err != nil {
			t.Fatal(err)
		}
		if err := streampub.EnsureGroup(ctx, c, "store", pub.Streams()); err != nil {
			t.Fatal(err)
		}
		stopRelay := p.RunRelay(t, pub)
		opts := &streampub.ConsumerOptions{MinIdle: 300 * time.Millisecond, Poll: 5 * time.Millisecond}
		var wg sync.WaitGroup
		var crashedHolding atomic.Int64
		stopAll := make(chan struct{})
		// member runs a consumer; if crashAfter > 0 it crashes (stops, holding its last batch
		// unacknowledged) after that many batches.
		member := func(name string, crashAfter int) {
			defer wg.Done()
			cons, err := streampub.NewConsumer(c, "store", name, pub.Streams(), opts)
			if err != nil {
				t.Error(err)
				return
			}
			for batch := 0; ; batch++ {
				select {
				case <-stopAll:
					return
				default:
				}
				msgs, err := cons.Receive(ctx, 8, 50*time.Millisecond)
				if err != nil {
					t.Errorf("%s: Receive: %v", name, err)
					return
				}
				if len(msgs) == 0 {
					continue
				}
				if crashAfter > 0 && batch >= crashAfter {
					crashedHolding.Add(int64(len(msgs)))
					return // dies holding msgs
				}
				a18Handle(t, p, cons, msgs)
			}
		}
		wg.Add(3)
		go member("a", 5)
		go member("b", 0)
		go member("c", 9)
		rng := rand.New(rand.NewPCG(18, 2))
		p.Traffic(t, 400, rng)
		time.Sleep(200 * time.Millisecond)
		wg.Add(1)
		go member("a", 0) // "a" restarts under its name
		p.Traffic(t, 200, rng)
		// Wait until every event is applied, or give up. miniredis's clock stands still until
		// moved (redistest.Miniredis), and with it the idle time XAUTOCLAIM reads: move it
		// between looks, or the last events a crashed member held are never claimed again. On a
		// real server this sleeps once more.
		p.WaitApplied(t, 12*time.Second, func() { redistest.Sleep(c, 50*time.Millisecond) })
		close(stopAll)
		wg.Wait()
		stopRelay()
		p.VerifyCrashed(t, crashedHolding.Load())
	})
}
