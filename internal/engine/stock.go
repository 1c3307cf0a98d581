package engine

import (
	"context"
	"fmt"
	"iter"
	"strconv"
	"time"

	"github.com/redis/rueidis"
	"github.com/stockres/stock/internal/bounded"
	"github.com/stockres/stock/internal/hints"
	"github.com/stockres/stock/internal/protocol"
)

// New is stock.New.
func New(client rueidis.Client, opts ...Option) (*Reserver, error) {
	if client == nil {
		return nil, invalid("nil client")
	}
	o := defaultOptions()
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if o.replicas > 0 {
		o.inflight = 0 // each write waits for its own acknowledgement
	}
	r := &Reserver{opts: o, limitArg: strconv.FormatInt(o.userLimit, 10), cmds: new(bounded.Gate)}
	r.client = bounded.New(client, o.timeout, r.cmds)
	r.keyCache = protocol.NewKeyCache(keyCacheSize, r.base)
	r.hints = hints.New(func(ctx context.Context, relay map[string]struct{}, holds map[string]int64) error {
		return r.writeHints(ctx, relay, holds, 0)
	}, o.timeout, o.logger)
	r.deducts.Send, r.deducts.SendOne = r.sendDeducts, r.sendDeduct
	r.claims.Send, r.claims.Unawaited = r.execClaims, claimUnawaited
	if o.soldOutTTL > 0 {
		r.soldOut = &soldOut{ttl: o.soldOutTTL}
		r.client = &trackedClient{Client: r.client, so: r.soldOut} // bounded too; see fastpath.go: own writes
	}
	return r, nil
}

// checkUser refuses a take without a user when WithUserRequired and a per-user limit are set.
func (r *Reserver) checkUser(what, sku, id, user string) error {
	if user == "" && r.opts.userReq && r.opts.userLimit > 0 {
		if what == "cart" {
			return invalid("cart %s has no User: with a per-user limit (WithUserLimit), WithUserRequired refuses it", id)
		}
		return invalid("request %s/%s has no User: with a per-user limit (WithUserLimit), WithUserRequired refuses it", sku, id)
	}
	return nil
}

// Load is stock.Reserver.Load.
func (r *Reserver) Load(ctx context.Context, sku string, qty int64) error {
	if err := r.enter(); err != nil {
		return err
	}
	defer r.calls.Leave()
	if err := checkName("sku", sku); err != nil {
		return err
	}
	if qty < 0 || qty > MaxQty {
		return invalid("load quantity %d out of range [0, %d]", qty, MaxQty)
	}
	if err := r.checkEviction(ctx); err != nil {
		return err
	}
	r.recordBaseline(ctx) // a new deployment records its epoch before its first item (guard.go)
	if n := r.bucketsOf(sku); n > 0 {
		return r.loadBucketed(ctx, sku, qty, n)
	}
	// An item Redis has split over buckets (a Reserver with WithBuckets loaded it) is loaded:
	// a plain copy beside its buckets would sell its stock twice.
	split, err := r.client.Do(ctx, r.client.B().Sismember().Key(r.registryKey()).Member(bucketName(sku, 0)).Build()).AsBool()
	if err != nil {
		return fmt.Errorf("stock: load %s: %w", sku, err)
	}
	if split {
		return fmt.Errorf("%w: %s is split over buckets in Redis (WithBuckets)", ErrLoaded, sku)
	}
	// Registry first: an item that is registered but not created is harmless (the reconciler
	// reports it), one that is created but not registered would be missed by the relay. And
	// again once created: a reconcile pass retiring the item's earlier life may have taken it
	// out of the registry meanwhile (reconciler.unregister).
	register := func() error {
		if err := r.client.Do(ctx, r.client.B().Sadd().Key(r.registryKey()).Member(sku).Build()).Error(); err != nil {
			return fmt.Errorf("stock: load %s: %w", sku, err)
		}
		return nil
	}
	if err := register(); err != nil {
		return err
	}
	code, _, err := decodePair(protocol.Load.Exec(ctx, r.client, r.item(sku).ForLoad(), []string{strconv.FormatInt(qty, 10)}))
	if err != nil {
		return fmt.Errorf("stock: load %s: %w", sku, err)
	}
	if code == protocol.Replay {
		return fmt.Errorf("%w: %s", ErrLoaded, sku)
	}
	if err := codeErr(code); err != nil {
		return err
	}
	return register()
}

// Levels is stock.Reserver.Levels.
func (r *Reserver) Levels(ctx context.Context, sku string) (Levels, error) {
	if err := r.enter(); err != nil {
		return Levels{}, err
	}
	defer r.calls.Leave()
	if err := checkName("sku", sku); err != nil {
		return Levels{}, err
	}
	if n := r.bucketsOf(sku); n > 0 {
		return r.levelsBucketed(ctx, sku, n)
	}
	return parseLevels(sku, r.client.Do(ctx, r.client.B().Hmget().Key(r.item(sku).Item).Field("a", "h", "s", "l", "c").Build()))
}

func parseLevels(sku string, res rueidis.RedisResult) (Levels, error) {
	vs, err := res.ToArray()
	if err != nil {
		return Levels{}, fmt.Errorf("stock: levels %s: %w", sku, err)
	}
	if len(vs) != 5 {
		return Levels{}, fmt.Errorf("%w: levels %s: %d values", ErrInvalid, sku, len(vs))
	}
	if vs[0].IsNil() {
		return Levels{}, fmt.Errorf("%w: %s", ErrNotLoaded, sku)
	}
	var n [4]int64
	for i := range n {
		if n[i], err = vs[i].AsInt64(); err != nil {
			return Levels{}, fmt.Errorf("%w: levels %s: field %d: %v", ErrInvalid, sku, i, err)
		}
	}
	closed, _ := vs[4].ToString()
	return Levels{Available: n[0], Held: n[1], Sold: n[2], Loaded: n[3], Closed: closed == "1"}, nil
}

// Deduct is stock.Reserver.Deduct.
func (r *Reserver) Deduct(ctx context.Context, req Request) (rc Receipt, err error) {
	if err := r.enter(); err != nil {
		return Receipt{SKU: req.SKU, ID: req.ID}, err
	}
	defer r.calls.Leave()
	local := false // answered by the sold-out fast path
	if r.opts.observer != nil {
		ctx = r.startOp(ctx, "deduct", req.SKU)
		defer func(start time.Time) { r.observeTake(ctx, "deduct", req.SKU, start, rc, err, local) }(time.Now())
	}
	rc = Receipt{SKU: req.SKU, ID: req.ID}
	if err := r.admit(ctx, req); err != nil {
		return rc, err
	}
	if n := r.bucketsOf(req.SKU); n > 0 {
		return r.takeBucketed(ctx, protocol.TakeDeduct, req, 0, n)
	}
	k := r.item(req.SKU)
	if r.knownSoldOut(ctx, req) {
		local = true
		rc.Qty = req.Qty
		return rc, ErrSoldOut
	}
	if r.opts.inflight > 0 {
		o, err := r.deducts.Do(ctx, req.SKU, req, r.opts.inflight)
		return r.takeReceipt(ctx, rc, k, protocol.TakeDeduct, req, o, nil, err)
	}
	o, ackErr, err := r.takeScript(ctx, k, protocol.TakeDeduct, req, 0)
	return r.takeReceipt(ctx, rc, k, protocol.TakeDeduct, req, o, ackErr, err)
}

// admit checks a request before anything is sent: valid, and the Reserver not fenced.
func (r *Reserver) admit(ctx context.Context, req Request) error {
	if err := checkRequest(req); err != nil {
		return err
	}
	if err := r.checkUser("request", req.SKU, req.ID, req.User); err != nil {
		return err
	}
	if r.isFenced(ctx) {
		return ErrFailover
	}
	return r.checkEviction(ctx)
}

// fenceRecheck is how often, at most, a fenced Reserver's requests check its guard themselves.
const fenceRecheck = time.Second

// isFenced reports whether a failover guard fences r. A fenced Reserver checks its latest guard
// again on the request that finds the fence, at most once per fenceRecheck (the other requests
// are refused at once): a repairing pass in another process lifts the fence even when nothing
// checks the guard here any more (a Run that ended), as ErrFailover's doc says.
func (r *Reserver) isFenced(ctx context.Context) bool {
	if !r.fenced.Load() {
		return false
	}
	g := r.guard.Load()
	now := time.Now().UnixNano()
	last := r.rechecked.Load()
	if g == nil || now-last < int64(fenceRecheck) || !r.rechecked.CompareAndSwap(last, now) {
		return true
	}
	fenced, _ := g.Check(ctx) // an error leaves the fence as it was
	return fenced
}

// take runs one deduct (kind "D") or hold ("H", for ttlMs) of a checked request.
func (r *Reserver) take(ctx context.Context, kind string, req Request, ttlMs int64) (Receipt, error) {
	k := r.item(req.SKU)
	o, ackErr, err := r.takeScript(ctx, k, kind, req, ttlMs)
	return r.takeReceipt(ctx, Receipt{SKU: req.SKU, ID: req.ID}, k, kind, req, o, ackErr, err)
}

// takeScript runs deduct.lua for one request.
func (r *Reserver) takeScript(ctx context.Context, k *protocol.Keys, kind string, req Request, ttlMs int64) (o outcome, ackErr error, err error) {
	args := []string{
		r.limitArg, r.outboxFlag(), kind, strconv.FormatInt(ttlMs, 10), r.clockArg(ctx),
		req.ID, strconv.FormatInt(req.Qty, 10), req.User, retryFlag(req.Retry),
	}
	res, ackErr := r.exec(ctx, protocol.Deduct, k.ForItem(), args)
	if kind == protocol.TakeHold {
		r.noteHold(req.SKU)
	} else {
		r.noteEvents(req.SKU)
	}
	o, err = decodeOne(res)
	return o, ackErr, err
}

// takeReceipt is the receipt of a take of req (kind protocol.TakeDeduct or TakeHold) whose
// script answered o (or failed with err); a refusal as sold out turns the fast path on for the
// item.
func (r *Reserver) takeReceipt(ctx context.Context, rc Receipt, k *protocol.Keys, kind string, req Request, o outcome, ackErr, err error) (Receipt, error) {
	if err != nil {
		return rc, fmt.Errorf("stock: deduct %s/%s: %w", rc.SKU, rc.ID, err)
	}
	if o.code == protocol.SoldOut {
		r.markSoldOut(rc.SKU, k)
	}
	rc, err = r.receiptAck(rc, o, ackErr)
	if o.code == protocol.Conflict {
		err = r.conflict(ctx, k.Ledger, rc, takeWant(kind, req))
	}
	return rc, err
}

// receiptAck is receipt, with the replica acknowledgement's error when the write was made, or
// replayed: a replay is as safe as the write it replays, which the replicas may not have yet.
// A refusal is never ErrNotReplicated, which says the units were taken (see WithReplicaAck).
func (r *Reserver) receiptAck(rc Receipt, o outcome, ackErr error) (Receipt, error) {
	rc, err := r.receipt(rc, o)
	if err == nil && ackErr != nil && (o.code == protocol.OK || o.code == protocol.Replay) {
		return rc, ackErr
	}
	return rc, err
}

func (r *Reserver) receipt(rc Receipt, o outcome) (Receipt, error) {
	rc.Qty, rc.Remaining, rc.Replayed = o.qty, o.remaining, o.code == protocol.Replay
	switch o.code {
	case protocol.Conflict:
		return rc, fmt.Errorf("%w: %s/%s was used with other parameters (quantity %d)", ErrConflict, rc.SKU, rc.ID, o.qty)
	case protocol.UserLimit:
		return rc, fmt.Errorf("%w: the user has %d of %d units of %s", ErrUserLimit, o.qty, r.opts.userLimit, rc.SKU)
	}
	return rc, codeErr(o.code)
}

// Restore is stock.Reserver.Restore.
func (r *Reserver) Restore(ctx context.Context, sku, id string) (Receipt, error) {
	if err := r.enter(); err != nil {
		return Receipt{SKU: sku, ID: id}, err
	}
	defer r.calls.Leave()
	return r.restore(ctx, sku, id)
}

// restore is Restore, for the calls of r that are in flight already.
func (r *Reserver) restore(ctx context.Context, sku, id string) (rc Receipt, err error) {
	if r.opts.observer != nil {
		ctx = r.startOp(ctx, "restore", sku)
		defer func(start time.Time) { r.observe(ctx, "restore", sku, start, rc, err) }(time.Now())
	}
	if err := r.writable(ctx, sku, id); err != nil {
		return Receipt{SKU: sku, ID: id}, err
	}
	return r.giveBack(ctx, sku, id, protocol.ReasonRestore)
}

func (r *Reserver) giveBack(ctx context.Context, sku, id, reason string) (Receipt, error) {
	return r.giveBackChecked(ctx, sku, id, reason, "", 0, "")
}

// giveBackChecked gives back only if the id took qty units as kind for user (kind "" = any id).
func (r *Reserver) giveBackChecked(ctx context.Context, sku, id, reason, kind string, qty int64, user string) (Receipt, error) {
	rc := Receipt{SKU: sku, ID: id}
	if err := checkName("sku", sku); err != nil {
		return rc, err
	}
	if err := checkName("id", id); err != nil {
		return rc, err
	}
	// sku, or the id's bucket: the one a take of the id claimed, else its home bucket, claimed
	// now by this give-back so that a late take of the id in any bucket answers ErrRestored.
	name, err := r.claimer(ctx, sku, id, true, true)
	if err != nil {
		return rc, err
	}
	args := []string{id, reason, r.outboxFlag()}
	if kind != "" {
		args = append(args, kind, strconv.FormatInt(qty, 10), user)
	}
	res, ackErr := r.exec(ctx, protocol.Restore, r.item(name).ForItem(), args)
	r.noteEvents(name)
	o, err := decodeOne(res)
	if err != nil {
		return rc, fmt.Errorf("stock: restore %s/%s: %w", sku, id, err)
	}
	w := conflictWant{} // any entry but a restock's
	if reason == protocol.ReasonCancel {
		w.kind = KindHold
	}
	if kind != "" {
		w = conflictWant{kind: takeKind(kind), qty: qty, user: user, checkUser: true}
	}
	return r.conflictReceipt(ctx, name, rc, o, ackErr, w)
}

// conflictReceipt is receiptAck, whose ErrConflict says what the request of item name (sku, or
// a bucket of it) differs in from the id's entry (see conflict).
func (r *Reserver) conflictReceipt(ctx context.Context, name string, rc Receipt, o outcome, ackErr error, w conflictWant) (Receipt, error) {
	rc, err := r.receiptAck(rc, o, ackErr)
	if o.code == protocol.Conflict {
		err = r.conflict(ctx, r.item(name).Ledger, rc, w)
	}
	return rc, err
}

// Restock is stock.Reserver.Restock.
func (r *Reserver) Restock(ctx context.Context, sku, id string, qty int64) (rc Receipt, err error) {
	if err := r.enter(); err != nil {
		return Receipt{SKU: sku, ID: id}, err
	}
	defer r.calls.Leave()
	if r.opts.observer != nil {
		ctx = r.startOp(ctx, "restock", sku)
		defer func(start time.Time) { r.observe(ctx, "restock", sku, start, rc, err) }(time.Now())
	}
	req := Request{SKU: sku, ID: id, Qty: qty}
	if err := checkRequest(req); err != nil {
		return Receipt{SKU: sku, ID: id}, err
	}
	if err := r.checkEviction(ctx); err != nil {
		return Receipt{SKU: sku, ID: id}, err
	}
	name, err := r.claimer(ctx, sku, id, true, false) // sku, or the bucket the id goes to
	if err != nil {
		return Receipt{SKU: sku, ID: id}, err
	}
	limit := int64(MaxQty) // the most name may hold after the restock
	if n := r.bucketsOf(sku); n > 0 {
		if limit, err = r.restockLimit(ctx, sku, name, n); err != nil {
			return Receipt{SKU: sku, ID: id}, err
		}
	}
	args := []string{id, strconv.FormatInt(qty, 10), r.outboxFlag(), strconv.FormatInt(limit, 10)}
	res, ackErr := r.exec(ctx, protocol.Restock, r.item(name).ForItem(), args)
	o, err := decodeOne(res)
	if err != nil || (o.code != protocol.NotLoaded && o.code != protocol.Invalid) {
		// The restock may have written an event (a definite refusal wrote nothing, and leaves
		// no hint behind: a restock of an unknown item changes nothing in Redis).
		r.noteEvents(name)
	}
	if err != nil {
		return Receipt{SKU: sku, ID: id}, fmt.Errorf("stock: restock %s/%s: %w", sku, id, err)
	}
	if o.code == protocol.Invalid {
		return Receipt{SKU: sku, ID: id}, invalid("restock %s/%s of %d units: the item would hold more than MaxQty (%d) units in all; nothing was added", sku, id, qty, int64(MaxQty))
	}
	return r.conflictReceipt(ctx, name, Receipt{SKU: sku, ID: id}, o, ackErr, conflictWant{kind: KindRestock, qty: qty})
}

// pendingCounts is stockops.Pending.
func (r *Reserver) pendingCounts(ctx context.Context, sku string) (pending, dead int64, err error) {
	if err := checkName("sku", sku); err != nil {
		return 0, 0, err
	}
	for _, name := range r.names(sku) {
		k := r.item(name)
		res := r.client.DoMulti(ctx, r.client.B().Zcard().Key(k.Outbox).Build(), r.client.B().Zcard().Key(k.Dead).Build())
		p, err := res[0].AsInt64()
		var d int64
		if err == nil {
			d, err = res[1].AsInt64()
		}
		if err != nil {
			return 0, 0, fmt.Errorf("stock: pending %s: %w", sku, err)
		}
		pending, dead = pending+p, dead+d
	}
	return pending, dead, nil
}

// items is stockops.Items.
func (r *Reserver) items(ctx context.Context) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		var cursor uint64
		for {
			se, err := r.client.Do(ctx, r.client.B().Sscan().Key(r.registryKey()).Cursor(cursor).Count(256).Build()).AsScanEntry()
			if err != nil {
				yield("", fmt.Errorf("stock: items: %w", err))
				return
			}
			for _, sku := range se.Elements {
				if !yield(sku, nil) {
					return
				}
			}
			if se.Cursor == 0 {
				return
			}
			cursor = se.Cursor
		}
	}
}

// CloseItem is stock.Reserver.CloseItem.
func (r *Reserver) CloseItem(ctx context.Context, sku string) error {
	return r.setClosed(ctx, sku, "1")
}

// ReopenItem is stock.Reserver.ReopenItem.
func (r *Reserver) ReopenItem(ctx context.Context, sku string) error {
	return r.setClosed(ctx, sku, "0")
}

func (r *Reserver) setClosed(ctx context.Context, sku, flag string) error {
	if err := r.enter(); err != nil {
		return err
	}
	defer r.calls.Leave()
	if err := r.writableItem(ctx, sku); err != nil {
		return err
	}
	if n := r.bucketsOf(sku); n > 0 && flag == "0" {
		// Reopened whole or not at all: a bucket delisted refuses the item.
		if err := r.refuseReopen(ctx, sku, n); err != nil {
			return err
		}
	}
	for _, name := range r.names(sku) { // the item, or every bucket of it
		if err := r.setClosedIn(ctx, sku, name, flag); err != nil {
			return err
		}
	}
	return nil
}

// setClosedIn sets the closed flag of the item name (sku, or a bucket of it).
func (r *Reserver) setClosedIn(ctx context.Context, sku, name, flag string) error {
	code, _, err := decodePair(protocol.Close.Exec(ctx, r.client, r.item(name).ForMarks(), []string{flag}))
	if err != nil {
		return fmt.Errorf("stock: close %s: %w", sku, err)
	}
	if code == protocol.NotLoaded {
		return fmt.Errorf("%w: %s", ErrNotLoaded, sku)
	}
	if code == protocol.Closed {
		return fmt.Errorf("%w: %s is delisted and cannot be reopened", ErrClosed, sku)
	}
	return codeErr(code)
}

// Delist is stock.Reserver.Delist.
func (r *Reserver) Delist(ctx context.Context, sku string) error {
	if err := r.enter(); err != nil {
		return err
	}
	defer r.calls.Leave()
	if err := r.writableItem(ctx, sku); err != nil {
		return err
	}
	if n := r.bucketsOf(sku); n > 0 {
		return r.delistBucketed(ctx, sku, n)
	}
	code, _, err := decodePair(protocol.Delist.Exec(ctx, r.client, r.item(sku).ForMarks(), nil))
	if err != nil {
		return fmt.Errorf("stock: delist %s: %w", sku, err)
	}
	if code == protocol.NotLoaded {
		return fmt.Errorf("%w: %s", ErrNotLoaded, sku)
	}
	return codeErr(code)
}
