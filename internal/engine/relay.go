package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/redis/rueidis"
	"github.com/stockres/stock/internal/protocol"
)

// apply checks o and sets its fields, or their defaults, on rl.
func (rl *Relay) apply(o *RelayOptions) error {
	rl.batch, rl.lease, rl.poll = 128, 30*time.Second, 100*time.Millisecond
	rl.minBackoff, rl.maxBackoff = 500*time.Millisecond, time.Minute
	if o == nil {
		return nil
	}
	if err := checkSKUs(o.Items); err != nil {
		return err
	}
	if o.Items != nil {
		rl.items = []string{}
		for _, s := range o.Items {
			rl.items = append(rl.items, rl.r.names(s)...) // a split item's events are in its buckets
		}
	}
	switch {
	case o.Batch < 0 || o.Batch > 10000:
		return invalid("relay batch %d out of range [1, 10000]", o.Batch)
	case o.Batch > 0:
		rl.batch = o.Batch
	}
	switch {
	case o.Lease < 0 || o.Lease > 0 && o.Lease < time.Millisecond:
		return invalid("relay lease %v below 1ms", o.Lease)
	case o.Lease > 0:
		rl.lease = o.Lease
	}
	if o.MinBackoff < 0 || o.MaxBackoff < 0 {
		return invalid("relay backoff [%v, %v]", o.MinBackoff, o.MaxBackoff)
	}
	if o.MinBackoff > 0 {
		rl.minBackoff = o.MinBackoff
	}
	if o.MaxBackoff > 0 {
		rl.maxBackoff = o.MaxBackoff
	}
	switch { // one bound given alone moves the default of the other
	case o.MaxBackoff == 0 && rl.minBackoff > rl.maxBackoff:
		rl.maxBackoff = rl.minBackoff
	case o.MinBackoff == 0 && rl.minBackoff > rl.maxBackoff:
		rl.minBackoff = rl.maxBackoff
	}
	if rl.maxBackoff < rl.minBackoff {
		return invalid("relay backoff [%v, %v]", rl.minBackoff, rl.maxBackoff)
	}
	switch {
	case o.Poll < 0:
		return invalid("relay poll %v", o.Poll)
	case o.Poll > 0:
		rl.poll = o.Poll
	}
	return nil
}

// Relay is stockops.Relay, documented there; Reserver.Run runs one.
type Relay struct {
	r          *Reserver
	store      Store
	pub        Publisher
	items      []string
	batch      int
	lease      time.Duration
	minBackoff time.Duration
	maxBackoff time.Duration
	poll       time.Duration
	token      string // identifies this relay's leases

	walk  registryWalk // Run's slow walk of the registry (see hints.go)
	clock serverClock  // Redis's clock, read at the start of each pass: the hints' scores
}

// newRelay is stockops.NewRelay.
func (r *Reserver) newRelay(store Store, pub Publisher, opts *RelayOptions) (*Relay, error) {
	if store == nil && pub == nil {
		return nil, invalid("relay with neither a store nor a publisher")
	}
	rl := &Relay{r: r, store: store, pub: pub, token: fmt.Sprintf("relay-%016x", rand.Uint64())}
	if err := rl.apply(opts); err != nil {
		return nil, err
	}
	return rl, nil
}

// Run is stockops.Relay.Run.
func (rl *Relay) Run(ctx context.Context) error {
	return rl.run(ctx, func(err error) { rl.r.opts.logger.WarnContext(ctx, "stock: relay pass", "err", err) }, true)
}

// run is Run, with the errors of passes handed to failed. With untilClosed it returns
// ErrReserverClosed once Close began (Reserver.Run's relay is stopped by Close through ctx
// instead, after the calls in flight, so that its last delivery sends their events).
func (rl *Relay) run(ctx context.Context, failed func(error), untilClosed bool) error {
	for {
		if untilClosed && rl.r.isClosed() {
			return fmt.Errorf("stock: relay: %w", ErrReserverClosed)
		}
		st, err := rl.pass(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			failed(err)
		}
		if st.Claimed == 0 || err != nil {
			t := time.NewTimer(rl.poll)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		}
	}
}

// Once is stockops.Relay.Once.
func (rl *Relay) Once(ctx context.Context) (relayStats, error) {
	rl.clock.read(ctx, rl.r)
	var st relayStats
	var first error
	drain := func(sku string) {
		if err := rl.drainItem(ctx, sku, &st); err != nil && first == nil {
			first = err
		}
	}
	if rl.items != nil {
		for _, sku := range rl.items {
			drain(sku)
		}
		return st, first
	}
	for sku, err := range rl.r.items(ctx) {
		if err != nil {
			return st, err
		}
		drain(sku)
	}
	return st, first
}

// drainItem delivers an item's due events a batch at a time until none is left or one fails.
func (rl *Relay) drainItem(ctx context.Context, sku string, st *relayStats) error {
	for {
		s, err := rl.drainBatch(ctx, sku)
		st.Add(s)
		if err != nil {
			return err
		}
		if s.Claimed < rl.batch {
			if s.Claimed > 0 {
				rl.releaseDetached(ctx, sku) // drained: the next relay or reconciler need not wait
			}
			return nil
		}
	}
}

// pass is Run's pass: the items whose due-work hints are due, and a few more of the registry
// once per poll interval (the slow walk that finds what a lost hint left). With
// RelayOptions.Items it is Once.
func (rl *Relay) pass(ctx context.Context) (relayStats, error) {
	if rl.items != nil {
		return rl.Once(ctx)
	}
	var st relayStats
	var errs []error
	now := rl.clock.read(ctx, rl.r)
	skus, err := rl.r.takeDue(ctx, protocol.RelayDue, now.UnixMilli(), 256)
	if err != nil {
		errs = append(errs, fmt.Errorf("stock: relay: due-work hints: %w", err))
	}
	if since := time.Since(rl.walk.at); since >= rl.poll || since < 0 {
		more, err := rl.walk.step(ctx, rl.r)
		if err != nil {
			errs = append(errs, fmt.Errorf("stock: relay: %w", err))
		}
		// Only the walked items with events: one pipelined read of their outboxes' sizes.
		busy, err := rl.r.withEvents(ctx, more)
		if err != nil {
			errs = append(errs, fmt.Errorf("stock: relay: %w", err))
		}
		skus = append(skus, busy...)
	}
	seen := make(map[string]bool, len(skus))
	for i, sku := range skus {
		if ctx.Err() != nil {
			// Stopping: give the hints taken and not looked at back, for the next relay.
			left := map[string]struct{}{}
			for _, s := range skus[i:] {
				left[s] = struct{}{}
			}
			_ = rl.r.writeHints(context.WithoutCancel(ctx), left, nil, 0)
			break
		}
		if seen[sku] {
			continue
		}
		seen[sku] = true
		if err := rl.drainItem(ctx, sku, &st); err != nil && len(errs) == 0 {
			errs = append(errs, err)
		}
	}
	return st, errors.Join(errs...)
}

// withEvents returns the items of skus whose outbox is not empty (all of them when the read
// fails), in one pipelined read.
func (r *Reserver) withEvents(ctx context.Context, skus []string) ([]string, error) {
	c := r.client
	cmds := make(rueidis.Commands, len(skus))
	for i, sku := range skus {
		cmds[i] = c.B().Zcard().Key(r.item(sku).Outbox).Build()
	}
	var out []string
	var first error
	for i, res := range c.DoMulti(ctx, cmds...) {
		n, err := res.AsInt64()
		if err != nil && first == nil {
			first = err
		}
		if err != nil || n > 0 {
			out = append(out, skus[i])
		}
	}
	return out, first
}

type claimed struct {
	member string
	seq    int64 // the event's sequence in its item (its outbox score)
	ev     Event
	store  bool // the event changes the Store
	tries  int64
	ok     bool // no entry: orphan
}

// release gives back the item's lease if this relay still holds it.
func (rl *Relay) release(ctx context.Context, sku string) {
	_ = protocol.Unlock.Exec(ctx, rl.r.client, rl.r.item(sku).ForLease(), []string{rl.token}).Error()
}

// releaseDetached is release that runs even when ctx is done (a relay that stops gives its
// lease back), bounded by releaseTimeout.
func (rl *Relay) releaseDetached(ctx context.Context, sku string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	rl.release(ctx, sku)
}

// releaseTimeout bounds the give-back of a lease after the caller's context is done.
const releaseTimeout = 2 * time.Second

// eventTypes maps an outbox event letter (and the entry) to the event type.
func eventType(letter byte, e Entry) (EventType, bool) {
	switch letter {
	case protocol.EventDeducted:
		if e.Kind == KindHold {
			return EventConfirmed, true
		}
		return EventDeducted, true
	case protocol.EventRestored:
		if e.State == StateRefused {
			return EventRefused, true
		}
		return EventRestored, true
	case protocol.EventRestocked:
		return EventRestocked, true
	case protocol.EventHeld:
		return EventHeld, true
	case protocol.EventCancelled:
		return EventCancelled, true
	case protocol.EventExpired:
		return EventExpired, true
	}
	return "", false
}

func storeApplies(t EventType) bool {
	switch t {
	case EventDeducted, EventConfirmed, EventRestocked, EventRestored, EventRefused:
		return true
	}
	return false
}

// claim leases the oldest events of an item. When another holder has the item's lease while
// its outbox has events, it returns none and records when to look again.
func (rl *Relay) claim(ctx context.Context, sku string) ([]claimed, error) {
	args := []string{strconv.Itoa(rl.batch), strconv.FormatInt(rl.lease.Milliseconds(), 10), rl.token}
	vs, err := protocol.Claim.Exec(ctx, rl.r.client, rl.r.item(sku).ForClaim(), args).AsStrSlice()
	if err != nil {
		if ctx.Err() != nil {
			// Stopped while the claim was on its way: it may have run and taken the lease,
			// which would hold the item from every other relay and reconciler until it runs
			// out. Give it back (only if it is this relay's). A claim still queued on another
			// of the client's connections may run after this release: its lease runs out.
			rl.releaseDetached(ctx, sku)
		}
		rl.r.retryAt(context.WithoutCancel(ctx), sku, rl.clock.now().Add(rl.poll))
		return nil, fmt.Errorf("stock: relay claim %s: %w", sku, err)
	}
	if b, ok := protocol.ParseClaimBusy(vs); ok {
		wait := time.Duration(b.TTL) * time.Millisecond
		if !b.Backoff {
			// Another relay (or a reconcile pass) drains it: look again soon, in case it
			// stops before events that came after its last claim.
			wait = min(wait, 4*rl.poll)
		}
		rl.r.retryAt(ctx, sku, rl.clock.now().Add(max(wait, 0)))
		return nil, nil
	}
	evs, err := protocol.ParseClaimReply(vs)
	if err != nil {
		return nil, fmt.Errorf("%w: relay claim %s: %v", ErrInvalid, sku, err)
	}
	out := make([]claimed, 0, len(evs))
	for _, oe := range evs {
		c := claimed{member: oe.Member, seq: oe.Seq, tries: oe.Tries}
		c.ev, c.ok = outboxEvent(parentOf(sku), oe.Member, oe.Entry, oe.Seq)
		c.store = c.ok && storeApplies(c.ev.Type)
		out = append(out, c)
	}
	return out, nil
}

// cutAt returns how many of the claimed events cs (in sequence) have a sequence up to cut.
func cutAt(cs []claimed, cut int64) int {
	for i, c := range cs {
		if c.seq > cut {
			return i
		}
	}
	return len(cs)
}

// unclaim gives events claimed and not delivered back as they were before the claim (their
// attempt counts go back down): held back by a barrier is not a failed delivery.
func (rl *Relay) unclaim(ctx context.Context, sku string, cs []claimed) error {
	k := rl.r.item(sku)
	cmds := make(rueidis.Commands, 0, len(cs))
	for _, c := range cs {
		cmds = append(cmds, rl.r.client.B().Hincrby().Key(k.Tries).Field(c.member).Increment(-1).Build())
	}
	for _, res := range rl.r.client.DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil {
			return fmt.Errorf("stock: relay %s: giving back events held by a transfer barrier: %w", sku, err)
		}
	}
	return nil
}

// outboxEvent builds the event of an outbox member ("<letter>:<id>") from its ledger entry
// (raw; "" if gone) and its sequence. ok is false when it cannot: the member is malformed, or
// the entry is gone or unreadable.
func outboxEvent(sku, member, raw string, seq int64) (Event, bool) {
	letter, id, ok := protocol.ParseMember(member)
	if !ok || raw == "" {
		return Event{}, false
	}
	e, err := parseEntry(sku, id, raw)
	if err != nil {
		return Event{}, false
	}
	t, known := eventType(letter, e)
	if !known {
		return Event{}, false
	}
	return Event{Type: t, SKU: sku, ID: id, User: e.User, Qty: e.Qty, At: e.At, Seq: seq}, true
}

// drainBatch delivers the oldest events of one item, in order, and stops at the first failure:
// the events before it are acked, it and the rest wait for a backoff that holds the whole item
// (an item's events are never delivered out of order).
func (rl *Relay) drainBatch(ctx context.Context, sku string) (st relayStats, err error) {
	cs, err := rl.claim(ctx, sku)
	if err != nil {
		return st, err
	}
	// A bucket's events behind a transfer barrier wait for the donor's events (see barrierCut):
	// only those before it are delivered now; the others go back to the outbox as they were, and
	// the item is looked at again after a poll interval, with no backoff.
	if len(cs) > 0 {
		cut, cerr := rl.r.barrierCut(ctx, sku, cs[len(cs)-1].seq, false)
		if cerr != nil {
			rl.release(context.WithoutCancel(ctx), sku)
			rl.r.retryAt(context.WithoutCancel(ctx), sku, rl.clock.now().Add(rl.poll))
			return st, cerr
		}
		if keep := cutAt(cs, cut); keep < len(cs) {
			if uerr := rl.unclaim(context.WithoutCancel(ctx), sku, cs[keep:]); uerr != nil {
				rl.release(context.WithoutCancel(ctx), sku)
				rl.r.retryAt(context.WithoutCancel(ctx), sku, rl.clock.now().Add(rl.poll))
				return st, uerr
			}
			cs = cs[:keep]
			defer func() {
				if err == nil { // a failure set a backoff or a retry of its own instead
					rl.release(context.WithoutCancel(ctx), sku)
					rl.r.retryAt(context.WithoutCancel(ctx), sku, rl.clock.now().Add(rl.poll))
				}
			}()
		}
	}
	st.Claimed = len(cs)
	if len(cs) == 0 {
		return st, nil
	}
	if rl.r.opts.observer != nil {
		ctx = rl.r.startOp(ctx, "relay", sku)
		defer func(start time.Time) { rl.observeBatch(ctx, sku, start, cs, st, err) }(time.Now())
	}
	errs := make([]error, len(cs))
	if rl.store != nil {
		rl.applyStore(ctx, cs, errs)
	}
	// What the store did must be recorded even when ctx ended meanwhile (a drain cut short, a
	// shutdown): the dead letters, give-backs, acknowledgements and backoff below are bounded
	// by WithTimeout, not by ctx, so an applied event is not delivered again after its lease.
	wctx := context.WithoutCancel(ctx)
	var acks []string
	var failed error
	var tries int64
	batch, _ := rl.pub.(BatchPublisher)
	var toPublish []pending
	for i, c := range cs {
		if c.tries > 1 {
			st.Redelive++
		}
		if !c.ok {
			// The event cannot be built: its ledger entry is gone (an evicted or deleted ledger
			// key) or unreadable. The units it took are counted in Redis and nowhere else: set
			// it aside in the dead-letter set, where the reconciler counts it and stops repairing
			// the item until an operator has looked, rather than drop an acknowledged sale.
			if derr := rl.deadLetter(wctx, sku, c.member); derr != nil {
				failed, tries = derr, c.tries
				st.Retried = len(cs) - i
				break
			}
			rl.r.opts.logger.ErrorContext(ctx, "stock: outbox event without a usable ledger entry; moved to the dead-letter set", "sku", sku, "event", c.member)
			st.Orphaned++
			st.DeadLettered++
			continue
		}
		err := errs[i]
		publish := rl.pub != nil
		if errors.Is(err, ErrRefused) && (c.ev.Type == EventDeducted || c.ev.Type == EventConfirmed) {
			// The database of record cannot cover it: give the stock back, once. The restore
			// queues an EventRefused, which tells the publisher.
			if _, rerr := rl.r.giveBack(wctx, c.ev.SKU, c.ev.ID, protocol.ReasonRefuse); rerr != nil && !errors.Is(rerr, ErrConflict) {
				err = fmt.Errorf("stock: relay give back %s/%s: %w", sku, c.ev.ID, rerr)
			} else {
				st.Refused++
				err, publish = nil, false
			}
		} else if errors.Is(err, ErrRefused) {
			err = nil // a restore or restock the store will not take: nothing to give back
		} else if errors.Is(err, ErrInvalid) {
			// The store can never apply it: set it aside for an operator rather than hold back
			// the item's later events forever.
			if derr := rl.deadLetter(wctx, sku, c.member); derr != nil {
				err = derr
			} else {
				rl.r.opts.logger.ErrorContext(ctx, "stock: the store rejects an event as invalid; moved to the dead-letter set", "sku", sku, "event", c.member, "err", err)
				st.DeadLettered++
				continue
			}
		}
		if err == nil && publish {
			if batch != nil {
				// Published below, with the item's other events, in one round trip.
				toPublish = append(toPublish, pending{i: i, ack: len(acks)})
				acks = append(acks, c.member)
				st.Delivered++
				continue
			}
			err = rl.pub.Publish(ctx, c.ev)
		}
		if err != nil {
			failed, tries = fmt.Errorf("stock: relay %s %s: %w", sku, c.member, err), c.tries
			st.Retried = len(cs) - i
			if c.store && errors.Is(errs[i], ErrNotLoaded) {
				// The store does not know the item: a setup error, not a refusal. The sale
				// stays in the outbox (no give-back, no dead letter) until the item is loaded
				// in the store; said loudly, once per item per interval.
				st.NotLoaded = len(cs) - i
				rl.r.storeUnknown(ctx, sku, err)
			} else {
				rl.r.opts.logger.WarnContext(ctx, "stock: relay delivery failed; the item backs off", "sku", sku, "event", c.member, "tries", c.tries, "err", err)
			}
			break
		}
		acks = append(acks, c.member)
		st.Delivered++
	}
	if len(toPublish) > 0 {
		if j, err := rl.publishBatch(ctx, batch, cs, toPublish); err != nil {
			// The events before the failed one are published; it and every event after it
			// (whatever the store or the queue did with them) wait for the backoff and are
			// delivered again, in order.
			p := toPublish[j]
			failed, tries = fmt.Errorf("stock: relay %s %s: %w", sku, cs[p.i].member, err), cs[p.i].tries
			rl.r.opts.logger.WarnContext(ctx, "stock: relay delivery failed; the item backs off", "sku", sku, "event", cs[p.i].member, "tries", cs[p.i].tries, "err", err)
			st.Delivered -= len(acks) - p.ack
			st.Retried = len(cs) - p.i
			acks = acks[:p.ack]
		}
	}
	if len(acks) > 0 {
		// With a store, the events are applied: they leave the outbox. On the queue path (no
		// store) they are only published: they move to the published set, in flight until a
		// consumer applies them through Consume.
		mode := ackApplied
		if rl.store == nil {
			mode = ackPublished
		}
		if err := rl.r.ack(wctx, sku, mode, acks); err != nil {
			// Not acked: the lease runs out and the events are delivered again (idempotent).
			rl.r.retryAt(wctx, sku, rl.clock.now().Add(rl.lease))
			return st, fmt.Errorf("stock: relay ack %s: %w", sku, err)
		}
	}
	if failed != nil {
		if ctx.Err() != nil && errors.Is(failed, ctx.Err()) {
			// Not a failure of the store or the queue: this relay is stopping. Give the item
			// back at once rather than hold it for a backoff, so that a last drain (Run's) or
			// another relay delivers the rest now.
			rl.release(wctx, sku)
			rl.r.retryAt(wctx, sku, time.Time{})
			return st, failed
		}
		d, err := rl.backoff(wctx, sku, tries)
		if err != nil {
			return st, errors.Join(failed, err)
		}
		rl.r.retryAt(wctx, sku, rl.clock.now().Add(d))
		return st, failed
	}
	return st, nil
}

// pending is an event of a batch waiting to be published: its index in the claimed batch and
// its place in the acks.
type pending struct{ i, ack int }

// publishBatch publishes the pending events of one item, in one round trip when there are
// several, and returns the index in ps of the first that failed, and its error (nil if none).
func (rl *Relay) publishBatch(ctx context.Context, bp BatchPublisher, cs []claimed, ps []pending) (int, error) {
	if len(ps) == 1 {
		return 0, bp.Publish(ctx, cs[ps[0].i].ev)
	}
	evs := make([]Event, len(ps))
	for j, p := range ps {
		evs[j] = cs[p.i].ev
	}
	res := bp.PublishBatch(ctx, evs)
	if len(res) != len(evs) {
		return 0, fmt.Errorf("stock: publisher answered %d results for %d events", len(res), len(evs))
	}
	for j, err := range res {
		if err != nil {
			return j, err
		}
	}
	return 0, nil
}

// deadLetter moves an outbox event to the item's dead-letter set.
func (rl *Relay) deadLetter(ctx context.Context, sku, member string) error {
	k := rl.r.item(sku)
	if err := protocol.DeadLetter.Exec(ctx, rl.r.client, k.ForDeadLetter(k.Outbox), []string{member}).Error(); err != nil {
		return fmt.Errorf("stock: relay dead-letter %s %s: %w", sku, member, err)
	}
	return nil
}

// Modes of ack.lua.
const (
	ackApplied   = "a" // the store has the events
	ackPublished = "p" // a publisher has them; no store was told
)

// ack settles delivered events of an item (lua/ack.lua).
func (r *Reserver) ack(ctx context.Context, sku, mode string, members []string) error {
	return protocol.Ack.Exec(ctx, r.client, r.item(sku).ForAck(), append([]string{mode}, members...)).Error()
}

// applyStore applies the store's events of a batch, in order, stopping at the first error that
// is not a refusal; the events after it are left unapplied (errNotTried).
func (rl *Relay) applyStore(ctx context.Context, cs []claimed, errs []error) {
	var idx []int
	var evs []Event
	for i, c := range cs {
		if c.ok && c.store {
			idx = append(idx, i)
			evs = append(evs, c.ev)
		}
	}
	if len(evs) == 0 {
		return
	}
	if bs, ok := rl.store.(BatchStore); ok && len(evs) > 1 {
		for len(evs) > 0 {
			if err := ctx.Err(); err != nil { // ended: start no store call that may not return
				for _, i := range idx {
					errs[i] = err
				}
				return
			}
			res := bs.ApplyBatch(ctx, evs)
			if len(res) != len(evs) {
				err := fmt.Errorf("stock: store answered %d results for %d events", len(res), len(evs))
				for _, i := range idx {
					errs[i] = err
				}
				return
			}
			next := len(evs)
			for j, i := range idx {
				errs[i] = res[j]
				if res[j] != nil && !errors.Is(res[j], ErrRefused) {
					if errors.Is(res[j], ErrInvalid) {
						next = j + 1 // dead-lettered by the caller: the rest go on
					}
					break
				}
			}
			if next == len(evs) {
				return
			}
			idx, evs = idx[next:], evs[next:]
		}
		return
	}
	for j, i := range idx {
		if err := ctx.Err(); err != nil { // ended: start no store call that may not return
			for _, k := range idx[j:] {
				errs[k] = err
			}
			return
		}
		errs[i] = rl.store.Apply(ctx, evs[j])
		if errs[i] != nil && !errors.Is(errs[i], ErrRefused) && !errors.Is(errs[i], ErrInvalid) {
			for _, k := range idx[j+1:] {
				errs[k] = errNotTried
			}
			return
		}
	}
}

var errNotTried = errors.New("stock: not tried after an earlier failure")

// backoff holds the item for a delay that doubles with every attempt of the failed event, with
// up to half of it again as random jitter, so a recovering database is not hit by every
// item at once.
func (rl *Relay) backoff(ctx context.Context, sku string, tries int64) (time.Duration, error) {
	d := rl.minBackoff
	for i := int64(1); i < tries && d < rl.maxBackoff; i++ {
		d *= 2
	}
	d = min(d, rl.maxBackoff)
	d += time.Duration(rand.Int64N(int64(d)/2 + 1))
	cmd := rl.r.client.B().Set().Key(rl.r.item(sku).Lease).Value("backoff").Px(d).Build()
	if err := rl.r.client.Do(ctx, cmd).Error(); err != nil {
		return 0, fmt.Errorf("stock: relay backoff %s: %w", sku, err)
	}
	return d, nil
}

// refuse is stockops.Refuse.
func (r *Reserver) refuse(ctx context.Context, sku, id string) (Receipt, error) {
	if err := r.writable(ctx, sku, id); err != nil {
		return Receipt{SKU: sku, ID: id}, err
	}
	return r.giveBack(ctx, sku, id, protocol.ReasonRefuse)
}

// Consume is stock.Consume.
func Consume(ctx context.Context, r *Reserver, store Store, ev Event) error {
	if err := r.enter(); err != nil {
		return err
	}
	defer r.calls.Leave()
	if err := checkName("sku", ev.SKU); err != nil {
		return err
	}
	if err := checkName("id", ev.ID); err != nil {
		return err
	}
	if storeApplies(ev.Type) {
		if err := checkAgainstLedger(ctx, r, ev); err != nil {
			return err
		}
	}
	member := eventMember(ev)
	tracked := member != "" && storeApplies(ev.Type) // kept in the published set until applied here
	name, err := r.holder(ctx, ev.SKU, ev.ID)        // the item whose outbox had the event: sku, or its bucket
	if err != nil {
		return err
	}
	if tracked && ev.Seq > 0 {
		// Across the buckets of a split item: an event past a transfer barrier waits until the
		// donor's events before the transfer are applied (see barrierCut).
		cut, err := r.barrierCut(ctx, name, ev.Seq, true)
		if errors.Is(err, ErrInvalid) { // a corrupt barrier, not this event: not for the dead letters
			return fmt.Errorf("stock: consume %s/%s: order check: %v", ev.SKU, ev.ID, err)
		}
		if err != nil {
			return fmt.Errorf("stock: consume %s/%s: order check: %w", ev.SKU, ev.ID, err)
		}
		if cut < ev.Seq {
			return fmt.Errorf("stock: consume %s %s (seq %d): events of another bucket that gave back units it may spend are not applied yet: %w", ev.SKU, member, ev.Seq, ErrHeldBack)
		}
		if err := catchUp(ctx, r, store, ev, name, member); err != nil {
			return err
		}
	}
	return consumeOne(ctx, r, store, ev, name, member, tracked)
}

// catchUpMax bounds the earlier events one Consume reads from each of the outbox and the
// published set. When a set has more, turn.lua returns only the events up to the last one it
// read from that set: the item's first earlier events, never the other set's later ones ahead
// of those it did not read.
const catchUpMax = 256

// catchUp applies, in sequence, the earlier events of ev's item that the store has not
// applied through Consume yet (a queue handed ev over first), reading them from Redis: the
// members of the published set and the outbox with a lower sequence, and their ledger
// entries. An error wrapping ErrHeldBack means ev must wait.
func catchUp(ctx context.Context, r *Reserver, store Store, ev Event, name, member string) error {
	vs, err := protocol.Turn.Exec(ctx, r.client, r.item(name).ForTurn(), []string{strconv.FormatInt(ev.Seq, 10), strconv.Itoa(catchUpMax)}).AsStrSlice()
	if err != nil {
		return fmt.Errorf("stock: consume %s/%s: order check: %w", ev.SKU, ev.ID, err)
	}
	turn, err := protocol.ParseTurnReply(vs)
	if err != nil {
		return fmt.Errorf("%w: consume %s/%s: order check: %v", ErrInvalid, ev.SKU, ev.ID, err)
	}
	if turn.Reconciling {
		return fmt.Errorf("stock: consume %s %s (seq %d): a reconcile pass holds the item: %w", ev.SKU, member, ev.Seq, ErrHeldBack)
	}
	type earlier struct {
		member string
		ev     Event
		ok     bool
	}
	var todo []earlier
	for _, oe := range turn.Earlier {
		e, ok := outboxEvent(ev.SKU, oe.Member, oe.Entry, oe.Seq)
		todo = append(todo, earlier{member: oe.Member, ev: e, ok: ok})
		if !ok {
			todo[len(todo)-1].ev.Seq = oe.Seq
		}
	}
	slices.SortFunc(todo, func(a, b earlier) int { return cmp.Compare(a.ev.Seq, b.ev.Seq) })
	for _, e := range todo {
		if !e.ok {
			// Its entry is gone: only its own message can tell what it was.
			return fmt.Errorf("stock: consume %s %s (seq %d): the earlier event %s cannot be read from Redis: %w", ev.SKU, member, ev.Seq, e.member, ErrHeldBack)
		}
		if err := consumeOne(ctx, r, store, e.ev, name, e.member, true); err != nil && !errors.Is(err, ErrInvalid) {
			return fmt.Errorf("stock: consume %s %s (seq %d): applying the earlier %s first: %w", ev.SKU, member, ev.Seq, e.member, err)
		}
	}
	if turn.More {
		return fmt.Errorf("stock: consume %s %s (seq %d): more than %d earlier events not applied yet: %w", ev.SKU, member, ev.Seq, catchUpMax, ErrHeldBack)
	}
	return nil
}

// consumeOne applies one event to store, gives the stock back when the store refuses a deduct,
// dead-letters it when the store rejects it as invalid, and, when tracked, settles it in Redis.
func consumeOne(ctx context.Context, r *Reserver, store Store, ev Event, name, member string, tracked bool) error {
	err := store.Apply(ctx, ev)
	switch {
	case errors.Is(err, ErrRefused) && (ev.Type == EventDeducted || ev.Type == EventConfirmed):
		if _, rerr := r.refuse(ctx, ev.SKU, ev.ID); rerr != nil && !errors.Is(rerr, ErrConflict) {
			return fmt.Errorf("stock: consume %s/%s: give back: %w", ev.SKU, ev.ID, rerr)
		}
	case errors.Is(err, ErrRefused):
	case errors.Is(err, ErrInvalid):
		if tracked {
			k := r.item(name)
			for _, from := range []string{k.Published, k.Outbox} {
				if derr := protocol.DeadLetter.Exec(ctx, r.client, k.ForDeadLetter(from), []string{member}).Error(); derr != nil {
					return fmt.Errorf("stock: consume %s/%s: dead-letter: %w (the store said: %w)", ev.SKU, ev.ID, derr, err)
				}
			}
			r.opts.logger.ErrorContext(ctx, "stock: the store rejects an event as invalid; moved to the dead-letter set", "sku", ev.SKU, "event", member, "err", err)
		}
		return fmt.Errorf("stock: consume %s/%s: %w", ev.SKU, ev.ID, err)
	case err != nil:
		if errors.Is(err, ErrNotLoaded) {
			r.storeUnknown(ctx, ev.SKU, err) // kept in Redis and in the queue, never given back
		}
		return fmt.Errorf("stock: consume %s/%s: %w", ev.SKU, ev.ID, err)
	}
	if tracked {
		// Applied: the event leaves the published set (and the outbox, should the relay not
		// have moved it there yet), and a reserved deduct or restock entry becomes applied.
		if err := r.ack(ctx, name, ackApplied, []string{member}); err != nil {
			return fmt.Errorf("stock: consume %s/%s: ack in Redis: %w", ev.SKU, ev.ID, err)
		}
	}
	return nil
}

// eventMember returns the outbox member of ev ("<letter>:<id>"), or "" for an unknown type.
func eventMember(ev Event) string {
	var letter byte
	switch ev.Type {
	case EventDeducted, EventConfirmed:
		letter = protocol.EventDeducted
	case EventRestored, EventRefused:
		letter = protocol.EventRestored
	case EventRestocked:
		letter = protocol.EventRestocked
	case EventHeld:
		letter = protocol.EventHeld
	case EventCancelled:
		letter = protocol.EventCancelled
	case EventExpired:
		letter = protocol.EventExpired
	default:
		return ""
	}
	return protocol.Member(letter, ev.ID)
}

// checkAgainstLedger refuses, with ErrInvalid and before the store sees it, an event that
// contradicts the ledger entry Redis has for its id: another quantity, or a kind of change the
// entry never made (a restore of a sale Redis never gave back). A queue can hold such a message:
// a stale copy from before Redis lost data, a dead letter republished by hand, another producer
// on the subject. An event whose entry Redis no longer has is let through: its message is then
// all that tells what happened.
func checkAgainstLedger(ctx context.Context, r *Reserver, ev Event) error {
	e, err := r.ledger(ctx, ev.SKU, ev.ID)
	if errors.Is(err, ErrUnknownID) || errors.Is(err, ErrNotLoaded) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stock: consume %s/%s: ledger: %w", ev.SKU, ev.ID, err)
	}
	ok := e.Qty == ev.Qty
	switch ev.Type {
	case EventDeducted:
		ok = ok && e.Kind == KindDeduct
	case EventConfirmed:
		ok = ok && e.Kind == KindHold && e.State != StateHeld && e.State != StateCancelled && e.State != StateExpired
	case EventRestocked:
		ok = ok && e.Kind == KindRestock
	case EventRestored:
		ok = ok && (e.Kind == KindDeduct || e.Kind == KindHold) && e.State == StateRestored
	case EventRefused:
		ok = ok && (e.Kind == KindDeduct || e.Kind == KindHold) && e.State == StateRefused
	}
	if !ok {
		return fmt.Errorf("%w: consume %s/%s: the event (%s of %d) contradicts Redis's ledger entry (%s, %s, %d): not applied", ErrInvalid, ev.SKU, ev.ID, ev.Type, ev.Qty, e.Kind, e.State, e.Qty)
	}
	return nil
}

type relayStats = RelayStats
