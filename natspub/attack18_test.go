package natspub_test

// Attack 18 on natspub, through its exported API, on the JetStream server of STOCK_TEST_NATS:
// a batch with a bad event in the middle, and awkward SKUs through a relay. Every test uses a
// stream and a subject prefix of its own, deleted at the end.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/stockres/stock"
	"github.com/stockres/stock/natspub"
)

// a18Stream connects, creates a stream of the test's own and returns it with its prefix.
func a18Stream(t *testing.T) (jetstream.JetStream, jetstream.Stream, string, string) {
	t.Helper()
	u := os.Getenv("STOCK_TEST_NATS")
	if u == "" {
		t.Skip("STOCK_TEST_NATS is not set (e.g. nats://127.0.0.1:4222)")
	}
	nc, err := nats.Connect(u)
	if err != nil {
		t.Fatalf("connect %s: %v", u, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	n := fmt.Sprintf("%d%d", time.Now().UnixNano(), rand.IntN(1e6))
	name, prefix := "A18_"+n, "a18."+n
	ctx := context.Background()
	st, err := natspub.EnsureStream(ctx, js, name, prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	return js, st, name, prefix
}

// a18Msgs reads every message the stream stores, in stream order.
func a18Msgs(t *testing.T, st jetstream.Stream) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := context.Background()
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			continue // deleted
		}
		out = append(out, m)
	}
	return out
}

func a18Ev(sku, id string, seq int64) stock.Event {
	return stock.Event{Type: stock.EventDeducted, SKU: sku, ID: id, Qty: 1, At: time.UnixMilli(1_700_000_000_000).UTC(), Seq: seq}
}

// An invalid event in the middle of one item's batch: the doc says that after an event cannot be
// sent, the later events of the same item are not sent.
func TestAttack18InvalidMidBatchStopsTheItem(t *testing.T) {
	js, st, name, prefix := a18Stream(t)
	pub, err := natspub.New(js, natspub.WithPrefix(prefix), natspub.WithStream(name), natspub.WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	evs := []stock.Event{a18Ev("n:1", "1", 1), a18Ev("n:1", "", 2), a18Ev("n:1", "3", 3), a18Ev("other", "1", 1)}
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
	var ids []string
	for _, m := range a18Msgs(t, st) {
		ev, err := natspub.Decode(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if ev.SKU == "n:1" {
			ids = append(ids, ev.ID)
		}
	}
	if errs[2] == nil {
		t.Errorf("the event after the item's invalid one was sent and answered nil (the stream has %v)", ids)
	} else if len(ids) != 1 {
		t.Errorf("answered %v for the event after the invalid one, but the stream has %v", errs[2], ids)
	}
}

// Awkward SKUs and ids: every event is stored once, on the subject Subject names (whose last token
// unescapes to the SKU), with its Nats-Msg-Id, and a second publish of the batch is dropped as a
// duplicate (within the window) while distinct events whose parts share a '/' are not.
func TestAttack18AwkwardSKUsSubjectsAndDuplicates(t *testing.T) {
	js, st, name, prefix := a18Stream(t)
	pub, err := natspub.New(js, natspub.WithPrefix(prefix), natspub.WithStream(name), natspub.WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	skus := []string{"a.b", "a*b", "a>b", "a/b", "a", "b/c", "ü~ñ", "😀", "%2E", "x y"}
	var evs []stock.Event
	for i, sku := range skus {
		evs = append(evs, a18Ev(sku, "b/c", int64(i+1)), a18Ev(sku, "b", int64(i+100)), a18Ev(sku, "c", int64(i+200)))
	}
	// ("a", "b/c") and ("a/b", "c") must stay two events.
	ctx := context.Background()
	for round := 0; round < 2; round++ {
		for i, err := range pub.PublishBatch(ctx, evs) {
			if err != nil {
				t.Fatalf("round %d: %s/%s: %v", round, evs[i].SKU, evs[i].ID, err)
			}
		}
	}
	msgs := a18Msgs(t, st)
	if len(msgs) != len(evs) {
		t.Errorf("the stream stores %d messages for %d distinct events published twice", len(msgs), len(evs))
	}
	seen := map[string]bool{}
	for _, m := range msgs {
		ev, err := natspub.Decode(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if m.Subject != natspub.Subject(prefix, ev.Type, ev.SKU) {
			t.Errorf("event of %q on subject %q, want %q", ev.SKU, m.Subject, natspub.Subject(prefix, ev.Type, ev.SKU))
		}
		last := m.Subject[strings.LastIndex(m.Subject, ".")+1:]
		if sku, err := url.PathUnescape(last); err != nil || sku != ev.SKU {
			t.Errorf("subject token %q unescapes to %q (%v), SKU %q", last, sku, err, ev.SKU)
		}
		if id := m.Header.Get("Nats-Msg-Id"); id != natspub.MsgID(ev) {
			t.Errorf("Nats-Msg-Id %q, MsgID %q", id, natspub.MsgID(ev))
		}
		k := ev.SKU + "\x00" + ev.ID
		if seen[k] {
			t.Errorf("event %q/%q stored twice", ev.SKU, ev.ID)
		}
		seen[k] = true
	}
}
