package model_test

import (
	"cmp"
	"errors"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/testkit"
)

// mEntry is one ledger entry of the model: what one id did to one item.
type mEntry struct {
	kind     stock.Kind
	state    stock.State // held, reserved (reserved and applied compare equal), restored, cancelled, expired, refused
	qty      int64
	after    int64 // available after the operation (deducts, holds, restocks)
	user     string
	deadline int64 // holds: ms
	// at is when the entry was made; settled when a sale was given back (or refused by the
	// store), 0 otherwise: windows [at, atHi] and [settled, settledHi] on a real server, whose
	// scripts read their own clock (sequences that reconcile only).
	at, atHi, settled, settledHi int64
	lack                         error // tombstones of a Retry refusal (state refused): the refusal recorded
	maybe                        bool  // a tombstone the library may or may not have written (resolved by the harness)
	// maybeExp: a due hold of a split item that this step's request may or may not have
	// released (a request releases the due holds of its own bucket only, unless its bucket was
	// short of stock); the harness reads the library's state back after the step.
	maybeExp bool
}

func (e *mEntry) taken() bool {
	return e.kind != stock.KindRestock && e.kind != stock.KindTombstone &&
		(e.state == stock.StateHeld || e.state == stock.StateReserved)
}

func (e *mEntry) released() bool {
	switch e.state {
	case stock.StateRestored, stock.StateCancelled, stock.StateExpired, stock.StateRefused:
		return true
	}
	return false
}

// mItem is one item of the model.
type mItem struct {
	avail, held, sold, loaded int64
	closed, delisted          bool
	ghost                     bool // not loaded: only ledger entries left by give-backs
	ledger                    map[string]*mEntry
	// kept is what each user still has of the item through entries the retention trimmed: a
	// trim gives no unit back (only restores, cancels and expiries do), and no give-back of a
	// trimmed id can reach it any more.
	kept map[string]int64
}

// trim removes the entry of id after the retention; the units its user took stay counted.
func (it *mItem) trim(id string) {
	if e := it.ledger[id]; e != nil && e.user != "" && e.taken() {
		if it.kept == nil {
			it.kept = map[string]int64{}
		}
		it.kept[e.user] += e.qty
	}
	delete(it.ledger, id)
}

// item returns the loaded item sku, or nil.
func (w *world) item(sku string) *mItem {
	if it := w.items[sku]; it != nil && !it.ghost {
		return it
	}
	return nil
}

// maybeTombstone records that a give-back of id may have left a tombstone on sku, loaded or not
// (an item not loaded keeps its ledger as a ghost).
func (w *world) maybeTombstone(sku, id string) {
	it := w.items[sku]
	if it == nil {
		it = &mItem{ghost: true, ledger: map[string]*mEntry{}}
		w.items[sku] = it
	}
	if it.ledger[id] == nil {
		it.ledger[id] = &mEntry{kind: stock.KindTombstone, state: stock.StateRestored, maybe: true}
	}
}

// putBack gives a taken entry's units back, from held or from sold, and leaves it in state.
func (it *mItem) putBack(e *mEntry, state stock.State) {
	if e.state == stock.StateHeld {
		it.held -= e.qty
	} else {
		it.sold -= e.qty
	}
	it.avail += e.qty
	e.state = state
}

// undo gives back a taken entry as a refused cart's undo does: a hold cancelled, a sale restored.
func (it *mItem) undo(e *mEntry) {
	if e.state == stock.StateHeld {
		it.putBack(e, stock.StateCancelled)
	} else {
		it.putBack(e, stock.StateRestored)
	}
}

// rehold takes back a hold the model had released and the library still holds.
func (it *mItem) rehold(e *mEntry) {
	e.state = stock.StateHeld
	it.held += e.qty
	it.avail -= e.qty
}

func (it *mItem) clone() *mItem {
	c := *it
	c.ledger = make(map[string]*mEntry, len(it.ledger))
	for id, e := range it.ledger {
		ce := *e
		c.ledger[id] = &ce
	}
	c.kept = maps.Clone(it.kept)
	return &c
}

func (it *mItem) levels() stock.Levels {
	return stock.Levels{Available: it.avail, Held: it.held, Sold: it.sold, Loaded: it.loaded, Closed: it.closed}
}

// units is what user holds or has bought of the item: the sum of its taken entries, and of
// those trimmed.
func (it *mItem) units(user string) int64 {
	n := it.kept[user]
	for _, e := range it.ledger {
		if e.user == user && e.taken() {
			n += e.qty
		}
	}
	return n
}

// mCart is a cart of the cart log.
type mCart struct {
	kind  stock.Kind // deduct or hold
	user  string
	lines []stock.Line // summed, in SKU order
	taken bool         // false: undone (a refused saga)
	// cause is the *CartError that undid a saga cart: every later copy answers it.
	causeSKU string
	cause    []error
	oneSlot  bool // taken by one script: no cart log, checked in its own items only
}

type world struct {
	// items holds loaded items, and ghosts: the ledgers of items that are not loaded, which a
	// restore, cancel or cart undo of an unknown item may leave behind.
	items map[string]*mItem
	carts map[string]*mCart
	limit int64
	group func(string) string
	// confirmExpired: ConfirmMany calls (cart id and items) undone because a hold expired.
	confirmExpired map[string]bool
	// limitReleasesAll: a request of a user under a per-user limit releases every due hold
	// (up to 10,000) even when it would not be refused (what the code does; FINDINGS 15).
	limitReleasesAll bool
	// released64: the takes of a one-script cart, whose script released each item's due holds
	// (at most 64) once, before its lines: take does not release another 64.
	released64 bool
	// buckets is the WithBuckets function of the Reservers (nil: no item is split); claims the
	// bucket each request id of a split item is claimed for (key: sku + "\x00" + id).
	buckets func(string) int
	claims  map[string]int
}

func newWorld(limit int64, group func(string) string, buckets func(string) int) *world {
	w := &world{items: map[string]*mItem{}, carts: map[string]*mCart{}, limit: limit, confirmExpired: map[string]bool{},
		buckets: buckets, claims: map[string]int{}}
	// A split item is never in a group (WithGroups is ignored for it).
	w.group = func(sku string) string {
		if w.nb(sku) > 0 {
			return ""
		}
		return group(sku)
	}
	return w
}

func (w *world) clone() *world {
	c := &world{items: make(map[string]*mItem, len(w.items)), carts: maps.Clone(w.carts), limit: w.limit, group: w.group,
		confirmExpired: maps.Clone(w.confirmExpired), buckets: w.buckets, claims: maps.Clone(w.claims)}
	for s, it := range w.items {
		c.items[s] = it.clone()
	}
	return c
}

// outcome is what an operation answers.
type outcome struct {
	err      error // nil or one sentinel
	alt      []error
	rc       stock.Receipt
	checkQty bool
	checkRem bool
	replay   int // 0 not replayed, 1 replayed, 2 either
	units    int64
	cartSKU  string // a *CartError naming this SKU
}

func (o outcome) errs() []error { return append([]error{o.err}, o.alt...) }

// dueHolds lists the ids of the item's holds due at now, live or released as maybe, earliest
// deadline first, then by id (the order of the holds' sorted set).
func (it *mItem) dueHolds(now int64) []string {
	var due []string
	for id, e := range it.ledger {
		if e.kind == stock.KindHold && (e.state == stock.StateHeld || e.maybeExp) && e.deadline <= now {
			due = append(due, id)
		}
	}
	slices.SortFunc(due, func(x, y string) int {
		return cmp.Or(cmp.Compare(it.ledger[x].deadline, it.ledger[y].deadline), strings.Compare(x, y))
	})
	return due
}

// expireN releases, as a deduct, hold, confirm or extend does, at most max of the item's due
// holds (math.MaxInt: all, as a sweep), and always the hold own names if it is due; it returns
// the units released. (Holds released as maybe are of split items, which expireSplit handles.)
func (it *mItem) expireN(now int64, max int, own string) int64 {
	var n int64
	for i, id := range it.dueHolds(now) {
		if e := it.ledger[id]; (i < max || id == own) && e.state == stock.StateHeld {
			n += e.qty
			it.putBack(e, stock.StateExpired)
		}
	}
	return n
}

// take is Deduct (kind deduct) and Hold (kind hold) of one request.
func (w *world) take(kind stock.Kind, sku, id, user string, qty int64, retry bool, ttl, now int64) outcome {
	o := outcome{rc: stock.Receipt{SKU: sku, ID: id, Qty: qty}}
	bucket := -1
	if n := w.nb(sku); n > 0 {
		// WithBuckets: the request goes to its buyer's bucket (its id's without a buyer); the
		// first request of an id claims a bucket for it, and a later request of the id for
		// another bucket is ErrConflict (ErrRestored after a restore that overtook it).
		key := id
		if user != "" {
			key = user
		}
		want := testkit.HomeBucket(key, n)
		if b := w.claim(sku, id, want); b != want {
			return w.claimedElsewhere(sku, id, o)
		}
		bucket = want
	}
	it := w.item(sku)
	if it == nil {
		o.err = stock.ErrNotLoaded
		if g := w.items[sku]; g != nil && g.ledger[id] != nil {
			// silent: the id has a tombstone an earlier give-back left on the unknown item;
			// ErrRestored (the cancel that overtook its request wins) is as good.
			o.alt = []error{stock.ErrRestored}
		}
		return o
	}
	// Every deduct and hold releases the item's due holds first: at most 64, and its own id's;
	// up to 10,000 when the request would otherwise be refused for stock or the user's limit.
	if bucket >= 0 {
		w.expireSplit(sku, it, now, 64, id, bucket)
	} else if !w.released64 {
		it.expireN(now, 64, id)
	}
	limited := user != "" && w.limit > 0
	if e := it.ledger[id]; e == nil && !it.closed && (it.avail-it.maybeUnits() < qty || (limited && (w.limitReleasesAll || it.units(user)+qty > w.limit))) {
		if bucket >= 0 {
			// The bucket releases every due hold of its own; when the item as a whole is
			// still short, so is the bucket, which then releases the other buckets' due
			// holds before it moves stock from them. A request over its buyer's limit is
			// refused in its bucket without moving stock (unless the bucket had none at all,
			// which the model does not track), so the other buckets' due holds stay maybe.
			w.expireSplit(sku, it, now, 10000, id, bucket)
			overLimit := limited && it.units(user)+qty > w.limit
			if it.avail-it.maybeUnits() < qty && !overLimit {
				it.expireAllMaybe()
			}
		} else {
			it.expireN(now, 10000, id)
		}
	}
	if e := it.ledger[id]; e != nil {
		switch {
		case e.kind == stock.KindTombstone && e.state == stock.StateRefused:
			// A Retry refused for lack of stock: the answer stays the final one, the refusal
			// it was (sold out or insufficient) with the stock of then, whatever came back or
			// was restocked since.
			o.err, o.rc.Remaining, o.checkRem = e.lack, e.after, true
		case e.kind == stock.KindTombstone:
			o.err = stock.ErrRestored
		case e.kind != kind || e.qty != qty || e.user != user:
			o.err, o.rc.Qty, o.checkQty = stock.ErrConflict, e.qty, true
		case e.state == stock.StateExpired:
			o.err = stock.ErrExpired
		case e.released():
			o.err = stock.ErrRestored
		default:
			o.rc.Remaining, o.rc.Replayed, o.replay = e.after, true, 1
			o.checkQty, o.checkRem = true, true
		}
		return o
	}
	switch {
	case it.closed:
		o.err = stock.ErrClosed
		return o
	case it.avail == 0:
		o.err, o.checkRem = stock.ErrSoldOut, true
	case user != "" && w.limit > 0 && it.units(user)+qty > w.limit:
		o.err, o.rc.Qty, o.checkQty = stock.ErrUserLimit, it.units(user), true
		return o
	case it.avail < qty:
		o.err, o.rc.Remaining, o.checkRem = stock.ErrInsufficient, it.avail, true
	}
	if o.err != nil { // lack of stock
		if retry {
			it.ledger[id] = &mEntry{kind: stock.KindTombstone, state: stock.StateRefused, qty: qty, after: it.avail, user: user, lack: o.err}
		}
		return o
	}
	it.avail -= qty
	e := &mEntry{kind: kind, qty: qty, after: it.avail, user: user}
	if kind == stock.KindHold {
		e.state, e.deadline = stock.StateHeld, now+ttl
		it.held += qty
	} else {
		e.state = stock.StateReserved
		it.sold += qty
	}
	it.ledger[id] = e
	o.rc.Remaining, o.checkQty, o.checkRem = it.avail, true, true
	return o
}

// giveBack is Restore (cancel false) and Cancel (cancel true).
func (w *world) giveBack(sku, id string, cancel bool, now int64) outcome {
	o := outcome{rc: stock.Receipt{SKU: sku, ID: id}}
	if n := w.nb(sku); n > 0 {
		w.claim(sku, id, testkit.HomeBucket(id, n)) // Restore and Cancel claim the id's home bucket
	}
	it := w.item(sku)
	if it == nil {
		// silent: a restore or cancel of an item that is not loaded is the restore of an
		// unknown id (ErrUnknownID, a tombstone), as a cancel may overtake even the load. A
		// second one is ErrUnknownID again.
		o.err = stock.ErrUnknownID
		w.maybeTombstone(sku, id)
		return o
	}
	e := it.ledger[id]
	if e == nil {
		it.ledger[id] = &mEntry{kind: stock.KindTombstone, state: stock.StateRestored}
		o.err = stock.ErrUnknownID
		return o
	}
	o.rc.Qty = e.qty
	switch {
	case e.kind == stock.KindTombstone:
		o.err = stock.ErrUnknownID // it never took anything
		return o
	case e.kind == stock.KindRestock || (cancel && e.kind != stock.KindHold):
		o.err, o.checkQty = stock.ErrConflict, true
		return o
	case e.released():
		o.rc.Replayed, o.replay, o.checkQty, o.checkRem = true, 1, true, true
		o.rc.Remaining = it.avail
		return o
	case cancel && e.state == stock.StateReserved:
		o.err = stock.ErrConfirmed
		return o
	}
	if e.state == stock.StateHeld && e.deadline <= now {
		// A hold past its deadline that no sweep released yet is released as expired, and
		// Cancel and Restore answer it as a replay (it had gone back).
		it.putBack(e, stock.StateExpired)
		o.replay, o.rc.Replayed = 1, true
	} else {
		it.undo(e)
	}
	o.rc.Remaining, o.checkQty, o.checkRem = it.avail, true, true
	return o
}

// liveHold is Confirm (confirm true) and Extend.
func (w *world) liveHold(sku, id string, confirm bool, ttl, now int64) outcome {
	o := outcome{rc: stock.Receipt{SKU: sku, ID: id}}
	it := w.item(sku)
	if it == nil {
		o.err, o.alt = stock.ErrUnknownID, []error{stock.ErrNotLoaded}
		if g := w.items[sku]; g != nil && g.ledger[id] != nil {
			o.err, o.alt = stock.ErrConflict, nil // a tombstone: not a hold
		}
		return o
	}
	if n := w.nb(sku); n > 0 {
		w.expireSplit(sku, it, now, 64, id, w.bucketOf(sku, id, n)) // the id's bucket's due holds
	} else {
		it.expireN(now, 64, id) // Confirm and Extend release due holds first (at most 64, and their own)
	}
	e := it.ledger[id]
	if e == nil {
		o.err = stock.ErrUnknownID
		return o
	}
	o.rc.Qty = e.qty
	switch {
	case e.kind == stock.KindTombstone:
		// An id that only has a tombstone is not a hold: "an id that is not a hold with
		// ErrConflict".
		o.err = stock.ErrConflict
	case e.kind != stock.KindHold:
		o.err, o.checkQty = stock.ErrConflict, true
	case e.state == stock.StateReserved && confirm:
		o.rc.Replayed, o.replay, o.checkQty = true, 1, true
	case e.state == stock.StateReserved:
		o.err = stock.ErrConfirmed
	case e.state == stock.StateExpired:
		o.err = stock.ErrExpired
	case e.released():
		o.err = stock.ErrRestored
	case confirm:
		e.state = stock.StateReserved
		it.held -= e.qty
		it.sold += e.qty
		o.rc.Remaining, o.checkQty, o.checkRem = it.avail, true, true
	default:
		e.deadline = now + ttl
		o.rc.Remaining, o.checkQty, o.checkRem = it.avail, true, true
	}
	return o
}

func (w *world) restock(sku, id string, qty int64) outcome {
	o := outcome{rc: stock.Receipt{SKU: sku, ID: id, Qty: qty}}
	if n := w.nb(sku); n > 0 {
		w.claim(sku, id, testkit.HomeBucket(id, n)) // Restock claims the id's home bucket
	}
	it := w.item(sku)
	if it == nil {
		o.err = stock.ErrNotLoaded
		if g := w.items[sku]; g != nil && g.ledger[id] != nil {
			o.alt = []error{stock.ErrRestored, stock.ErrConflict} // silent: a tombstone on an unknown item
		}
		return o
	}
	if e := it.ledger[id]; e != nil {
		switch {
		case e.kind == stock.KindTombstone:
			o.err, o.alt = stock.ErrRestored, []error{stock.ErrConflict}
		case e.kind != stock.KindRestock || e.qty != qty:
			o.err, o.rc.Qty, o.checkQty = stock.ErrConflict, e.qty, true
		default:
			// silent: Remaining of a replayed restock (the recorded value, like a deduct's).
			o.rc.Remaining, o.rc.Replayed, o.replay, o.checkQty = e.after, true, 1, true
		}
		return o
	}
	// silent: a closed item still takes a restock (restores and the pipeline go on).
	it.avail += qty
	it.loaded += qty
	it.ledger[id] = &mEntry{kind: stock.KindRestock, state: stock.StateReserved, qty: qty, after: it.avail}
	o.rc.Remaining, o.checkQty, o.checkRem = it.avail, true, true
	return o
}

func (w *world) load(sku string, qty int64) outcome {
	if w.item(sku) != nil {
		return outcome{err: stock.ErrLoaded}
	}
	led := map[string]*mEntry{}
	if g := w.items[sku]; g != nil {
		led = g.ledger // what give-backs left before the item was loaded
	}
	w.items[sku] = &mItem{avail: qty, loaded: qty, ledger: led}
	return outcome{}
}

// lifecycle is Close, Reopen and Delist, of a plain item or a split one alike (a split item is
// closed, reopened and delisted whole).
func (w *world) lifecycle(op, sku string) outcome {
	it := w.item(sku)
	if it == nil {
		return outcome{err: stock.ErrNotLoaded}
	}
	switch op {
	case "close":
		it.closed = true
	case "delist":
		it.closed, it.delisted = true, true
	case "reopen":
		if it.delisted {
			// A delisted item cannot be reopened: ErrClosed, nothing changed.
			return outcome{err: stock.ErrClosed}
		}
		it.closed = false
	}
	return outcome{}
}

// sweep releases the due holds of sku (all items when sku is "").
func (w *world) sweep(sku string, now int64) outcome {
	var n int64
	for s, it := range w.items {
		if (sku == "" || s == sku) && !it.ghost {
			n += it.expireN(now, math.MaxInt, "")
		}
	}
	o := outcome{units: n}
	if sku != "" && w.item(sku) == nil {
		o.alt = []error{stock.ErrNotLoaded} // silent: a sweep of an unknown item: nothing, or ErrNotLoaded
	}
	return o
}

// sumLines sums a cart's lines per item, in SKU order.
func sumLines(lines []stock.Line) []stock.Line {
	m := map[string]int64{}
	for _, l := range lines {
		m[l.SKU] += l.Qty
	}
	out := make([]stock.Line, 0, len(m))
	for s, q := range m {
		out = append(out, stock.Line{SKU: s, Qty: q})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SKU < out[j].SKU })
	return out
}

// oneSlot reports whether a cart is taken by one script (every item in one group).
func (w *world) oneSlot(lines []stock.Line) bool {
	g := w.group(lines[0].SKU)
	if g == "" || len(lines) < 2 {
		return false
	}
	for _, l := range lines {
		if w.group(l.SKU) != g {
			return false
		}
	}
	return true
}

// cart is DeductMany (kind deduct) and HoldMany (kind hold).
func (w *world) cart(kind stock.Kind, id, user string, raw []stock.Line, ttl, now int64) (outcome, []outcome) {
	lines := sumLines(raw)
	// A line of a split item is taken as a Deduct or a Hold of it is (take: its buyer's bucket,
	// the claims, the due holds of the other buckets); w.group puts a split item in no group,
	// so a cart with a split line is always a saga.
	if c := w.carts[id]; c != nil && !w.oneSlot(lines) {
		if c.user != user || c.kind != kind || !slices.Equal(c.lines, lines) {
			// A cart id used by another user, or with other lines: ErrConflict, nothing changed.
			return outcome{err: stock.ErrConflict}, nil
		}
		if !c.taken {
			// Undone: every later copy answers the *CartError that undid the cart, after giving
			// back what is left: the undo runs again, and a line whose entry is gone (its
			// tombstone trimmed past the retention) gets a tombstone again. Whether the trim
			// came first is a matter of real time on a real server: the harness reads it back.
			for _, l2 := range lines {
				// A split line's tombstone is in a bucket the model tracks by its claim: left as it is.
				if w.nb(l2.SKU) == 0 {
					w.maybeTombstone(l2.SKU, id)
				}
			}
			return outcome{err: c.cause[0], alt: c.cause[1:], cartSKU: c.causeSKU}, nil
		}
		if c.kind == stock.KindHold {
			// A retry of a cart of holds answers the holds' state, as Hold does (releasing
			// due holds first): a *CartError of the first line whose hold expired or was
			// given back; nothing is given back.
			for _, l := range c.lines {
				it := w.item(l.SKU)
				if it == nil {
					continue
				}
				if n := w.nb(l.SKU); n > 0 {
					// A split line: a Hold of it, in the bucket the cart id is claimed for,
					// releases that bucket's due holds (at most 64, and its own).
					w.expireSplit(l.SKU, it, now, 64, id, w.bucketOf(l.SKU, id, n))
				} else {
					it.expireN(now, math.MaxInt, "")
				}
				if e := it.ledger[id]; e != nil && e.kind == stock.KindHold {
					switch {
					case e.state == stock.StateExpired:
						return outcome{err: stock.ErrExpired, cartSKU: l.SKU}, nil
					case e.released():
						return outcome{err: stock.ErrRestored, cartSKU: l.SKU}, nil
					}
				}
			}
		}
		// A retry of a completed cart answers the cart's outcome, even after one of its
		// lines was given back, and never undoes the lines it took.
		return outcome{replay: 1}, nil
	}
	one := w.oneSlot(lines)
	if one {
		// One script: it releases the due holds of every item of the cart first, whatever
		// its answer (as a refused Deduct does), and take does not release another 64.
		for _, l := range lines {
			if it := w.item(l.SKU); it != nil {
				it.expireN(now, 64, id)
			}
		}
		w.released64 = true
		defer func() { w.released64 = false }()
	}
	saved := w.clone()
	var outs []outcome
	for _, l := range lines {
		o := w.take(kind, l.SKU, id, user, l.Qty, false, ttl, now)
		if o.err == nil {
			// Taken, or a replay. A one-script cart is checked against the id's entries in its
			// own items only: a line that is still this cart's entry is a replay. For a saga,
			// an entry of the cart id with the line's kind, quantity and user that the cart
			// log does not know (drawn: a Hold of a split item under a cart's id) cannot be
			// told from its line taken by a copy of the cart: it is the cart's line, replayed,
			// and an undo gives it back ("the cart's own line (same kind, quantity and user)").
			outs = append(outs, o)
			continue
		}
		ce := outcome{err: o.err, alt: o.alt, cartSKU: l.SKU}
		if one {
			// One script, checked before the first write: nothing changed, nothing recorded.
			*w = *saved
			return ce, nil
		}
		// The saga: the lines taken before are given back, the others get a tombstone (so a
		// slow saga cannot take them later), and the cart is undone.
		for _, l2 := range lines {
			if n := w.nb(l2.SKU); n > 0 {
				// The undo's give-back claims the id's home bucket when no take did, and
				// leaves the tombstone there: a slow copy of the saga, of whatever buyer's
				// bucket, is refused with ErrRestored.
				w.claim(l2.SKU, id, testkit.HomeBucket(id, n))
			}
			it := w.item(l2.SKU)
			if it == nil || it.ledger[id] == nil {
				w.maybeTombstone(l2.SKU, id)
				continue
			}
			if e := it.ledger[id]; e.kind == kind && e.qty == l2.Qty && e.user == user && e.taken() {
				it.undo(e) // this cart's line
			}
		}
		w.carts[id] = &mCart{kind: kind, user: user, lines: lines, causeSKU: l.SKU, cause: ce.errs()}
		return ce, nil
	}
	w.carts[id] = &mCart{kind: kind, user: user, lines: lines, taken: true, oneSlot: one}
	if one && !slices.ContainsFunc(outs, func(o outcome) bool { return o.replay != 1 }) {
		return outcome{replay: 1}, outs // every line still this one-script cart's entry
	}
	return outcome{}, outs
}

// confirmMany and cancelMany work on the holds of a cart's items, in SKU order.
func (w *world) confirmMany(id string, skus []string, now int64) outcome {
	skus = sortedUnique(skus)
	key := id + "|" + strings.Join(skus, "|") // a retry: the same cart id and items
	if w.confirmExpired[key] {
		// "A retry of a cart undone because a hold expired answers ErrExpired again."
		return outcome{err: stock.ErrExpired}
	}
	for i, sku := range skus {
		o := w.liveHold(sku, id, true, 0, now)
		if o.err == nil {
			continue
		}
		if errors.Is(o.err, stock.ErrExpired) || errors.Is(o.err, stock.ErrRestored) {
			// Confirmed whole or not at all: the confirmed ones are given back, the others
			// cancelled.
			for _, s := range skus[:i] {
				w.giveBack(s, id, false, now)
			}
			for _, s := range skus[i+1:] {
				w.giveBack(s, id, true, now)
			}
			if errors.Is(o.err, stock.ErrExpired) {
				w.confirmExpired[key] = true
			}
			return outcome{err: o.err, alt: o.alt, cartSKU: sku}
		}
		return outcome{err: o.err, alt: o.alt}
	}
	return outcome{}
}

func (w *world) cancelMany(id string, skus []string, now int64) outcome {
	for _, sku := range sortedUnique(skus) {
		o := w.giveBack(sku, id, true, now)
		if o.err != nil && !errors.Is(o.err, stock.ErrUnknownID) {
			if slices.Contains(o.alt, stock.ErrUnknownID) {
				return outcome{err: o.err, alt: append(o.alt, nil)}
			}
			return outcome{err: o.err, alt: o.alt}
		}
	}
	return outcome{}
}

func sortedUnique(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

// nb is the number of buckets of sku: 0 when it is not split.
func (w *world) nb(sku string) int {
	if w.buckets == nil {
		return 0
	}
	if n := w.buckets(sku); n >= 2 {
		return min(n, 64)
	}
	return 0
}

func claimKey(sku, id string) string { return sku + "\x00" + id }

// bucketOf is the bucket id is claimed for on sku (of n buckets), else the id's home bucket.
func (w *world) bucketOf(sku, id string, n int) int {
	if b, ok := w.claims[claimKey(sku, id)]; ok {
		return b
	}
	return testkit.HomeBucket(id, n)
}

// claim returns the bucket id is claimed for on sku, claiming want when no request did.
func (w *world) claim(sku, id string, want int) int {
	k := claimKey(sku, id)
	if b, ok := w.claims[k]; ok {
		return b
	}
	w.claims[k] = want
	return want
}

// claimedElsewhere is the answer to a take of an id claimed for another bucket than the
// request's: ErrRestored when a restore overtook it (a tombstone), the refusal of a Retry,
// else ErrConflict (with the quantity the id was first used with, Receipt's doc).
func (w *world) claimedElsewhere(sku, id string, o outcome) outcome {
	var e *mEntry
	if it := w.items[sku]; it != nil {
		e = it.ledger[id]
	}
	switch {
	case e == nil:
		o.err = stock.ErrConflict
	case e.kind == stock.KindTombstone && e.maybe:
		o.err, o.alt = stock.ErrRestored, []error{stock.ErrConflict}
	case e.kind == stock.KindTombstone && e.state == stock.StateRefused:
		o.err, o.rc.Remaining, o.checkRem = e.lack, e.after, true
	case e.kind == stock.KindTombstone:
		o.err = stock.ErrRestored
	default:
		o.err, o.rc.Qty, o.checkQty = stock.ErrConflict, e.qty, true
	}
	return o
}

// expireSplit releases, as a request on bucket b of a split item does, at most max of the
// bucket's due holds (earliest deadline first, then by id) and always own's. The due holds of
// the other buckets, and those of b past max, are released as maybe (maybeExp): the library
// may have released them too (a bucket short of stock does), the harness reads them back.
func (w *world) expireSplit(sku string, it *mItem, now int64, max int, own string, b int) {
	k := 0
	for _, id := range it.dueHolds(now) {
		e := it.ledger[id]
		cb, ok := w.claims[claimKey(sku, id)]
		mine := ok && cb == b
		definite := id == own || (mine && k < max)
		if mine {
			k++
		}
		if e.state == stock.StateHeld {
			it.putBack(e, stock.StateExpired)
			e.maybeExp = !definite
		} else if definite {
			e.maybeExp = false
		}
	}
}

// maybeUnits is the units of the holds released as maybe.
func (it *mItem) maybeUnits() int64 {
	var n int64
	for _, e := range it.ledger {
		if e.maybeExp {
			n += e.qty
		}
	}
	return n
}

// expireAllMaybe makes every maybe release of the item definite.
func (it *mItem) expireAllMaybe() {
	for _, e := range it.ledger {
		e.maybeExp = false
	}
}
