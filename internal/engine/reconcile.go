package engine

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"
	"github.com/stockres/stock/internal/protocol"
)

// apply checks o and sets its fields, or their defaults, on rc.
func (rc *Reconciler) apply(o *ReconcileOptions) error {
	rc.retention, rc.interval = 24*time.Hour, 5*time.Minute
	if o == nil {
		return nil
	}
	if err := checkSKUs(o.Items); err != nil {
		return err
	}
	if o.Items != nil {
		rc.items = append([]string{}, o.Items...)
	}
	if o.RepairLimit < 0 {
		return invalid("repair limit %d", o.RepairLimit)
	}
	rc.dry, rc.limit = o.DryRun, o.RepairLimit
	switch {
	case o.Retention < 0:
		rc.retention = 0
	case o.Retention > 0:
		rc.retention = o.Retention
	}
	if o.Interval != 0 {
		rc.interval = o.Interval
	}
	return nil
}

// Reconciler is stockops.Reconciler, documented there; Reserver.Run runs one.
type Reconciler struct {
	r         *Reserver
	store     Store
	dry       bool
	limit     int64
	retention time.Duration
	items     []string
	interval  time.Duration
	token     string
	pass      sync.Mutex // one pass of an item at a time: the item leases carry one token
	// restocked and sold are the units of the restocks and of the sales the item's pass wrote
	// back (rerecord), under pass: its adjust counts them as loaded and as sold (a failover lost
	// their counts with them), and the rest of the drift by its sign.
	restocked, sold int64
}

// newReconciler is stockops.NewReconciler.
func (r *Reserver) newReconciler(store Store, opts *ReconcileOptions) (*Reconciler, error) {
	if store == nil {
		return nil, invalid("reconciler without a store")
	}
	rc := &Reconciler{r: r, store: store, token: fmt.Sprintf("reconcile-%016x", rand.Uint64())}
	if err := rc.apply(opts); err != nil {
		return nil, err
	}
	return rc, nil
}

// Run is stockops.Reconciler.Run.
func (rc *Reconciler) Run(ctx context.Context) error {
	if rc.interval < 0 {
		return invalid("reconcile interval %v: Reconciler.Run needs a positive one", rc.interval)
	}
	t := time.NewTicker(rc.interval)
	defer t.Stop()
	for {
		if rc.r.isClosed() {
			return fmt.Errorf("stock: reconcile: %w", ErrReserverClosed)
		}
		reps, err := rc.Once(ctx)
		if errors.Is(err, ErrRegistryLost) {
			rc.r.opts.logger.ErrorContext(ctx, "stock: reconcile", "err", err)
		} else if err != nil && ctx.Err() == nil {
			rc.r.opts.logger.WarnContext(ctx, "stock: reconcile", "err", err)
		}
		rc.log(ctx, reps)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// log logs the reports that found something: an error for those that need a human, a warning
// for those with a repair.
func (rc *Reconciler) log(ctx context.Context, reps []report) {
	for _, rp := range reps {
		if rp.NeedsHuman != "" {
			rc.r.opts.logger.ErrorContext(ctx, "stock: reconcile", "report", rp.String())
		} else if rp.Drift != 0 || rp.Rebuilt || rp.Requeued > 0 || rp.Rerecorded > 0 {
			rc.r.opts.logger.WarnContext(ctx, "stock: reconcile", "report", rp.String())
		}
	}
}

// Once is stockops.Reconciler.Once.
func (rc *Reconciler) Once(ctx context.Context) ([]report, error) {
	res, err := rc.Pass(ctx)
	return res.Reports, err
}

// maxPending bounds the pending events a pass reads per item.
const maxPending = 100000

// Item is stockops.Reconciler.Item.
func (rc *Reconciler) Item(ctx context.Context, sku string) (rp report, err error) {
	if o := rc.r.opts.observer; o != nil {
		ctx = rc.r.startOp(ctx, "reconcile", sku)
		defer func(start time.Time) {
			ob := Observation{Op: "reconcile", SKU: sku, Outcome: "ok", Duration: time.Since(start), Units: rp.Drift}
			switch {
			case err != nil:
				ob.Outcome = "error"
			case rp.Busy:
				ob.Outcome = "busy"
			}
			o.Observe(ctx, ob)
		}(time.Now())
	}
	if err := checkName("sku", sku); err != nil {
		return report{SKU: sku}, err
	}
	rc.pass.Lock()
	defer rc.pass.Unlock()
	rp, err = rc.item(ctx, sku)
	// A pass is safe to run again: every repair checks the state it was computed from. A
	// connection broken under it (the first write on each pooled connection after a Redis
	// restart fails) is worth a second try before the item is reported as failed.
	for try := 0; try < 2 && brokenConn(err) && ctx.Err() == nil; try++ {
		rp, err = rc.item(ctx, sku)
	}
	return rp, err
}

// item is one pass of Item, under rc.pass: under the item's lease, its lifecycle, the store's
// stock, the ledger (lost events, lost entries, trimming), a snapshot of Redis, the comparison
// with the store, the repairs, and the registry and retirement.
func (rc *Reconciler) item(ctx context.Context, sku string) (rp report, err error) {
	rc.restocked, rc.sold = 0, 0
	if n := rc.r.bucketsOf(sku); n > 0 {
		return rc.itemBucketed(ctx, sku, n)
	}
	rp = report{SKU: sku}
	ok, err := rc.lock(ctx, sku)
	if err != nil {
		rc.unlock(sku) // the SET may have run before the error: never leave our lock behind
		return rp, err
	}
	if !ok {
		rp.Busy = true
		return rp, nil
	}
	defer rc.unlock(sku)

	k := rc.r.item(sku)
	delisted, err := rc.lifecycle(ctx, k, &rp)
	if err != nil || rp.Retired {
		return rp, err
	}
	unknown, err := rc.storeRemaining(ctx, &rp)
	if err != nil {
		return rp, err
	}
	// Lost events first, so that they count as in flight below; lost entries; trimming.
	if !unknown {
		if err := rc.ledgerPass(ctx, k, &rp); err != nil {
			return rp, err
		}
	}
	snap, err := rc.snapshot(ctx, k, &rp)
	if err != nil || rp.NeedsHuman != "" {
		return rp, err
	}
	if unknown {
		snap.unknownToStore(&rp)
		return rp, nil
	}
	if rp.Missing && rc.splitInRedis(ctx, sku) {
		// Rebuilt as a plain item from the store's stock, it would sell the stock its buckets
		// hold a second time.
		rp.NeedsHuman = "Redis has the item split over buckets, and this Reserver does not split it: not repaired"
		return rp, nil
	}
	expected, err := rc.compare(ctx, &rp, snap)
	if err != nil || rp.Busy {
		return rp, err
	}
	if err := rc.repair(ctx, k, &rp, expected); err != nil {
		return rp, err
	}
	return rp, rc.conclude(ctx, k, &rp, delisted)
}

// lifecycle reads whether the item was retired (rp.Retired) and when it was delisted (0: never).
func (rc *Reconciler) lifecycle(ctx context.Context, k *protocol.Keys, rp *report) (delisted int64, err error) {
	life, err := rc.r.client.Do(ctx, rc.r.client.B().Hmget().Key(k.Item).Field("x", "d").Build()).ToArray()
	if err != nil || len(life) != 2 {
		return 0, fmt.Errorf("stock: reconcile %s: %w", rp.SKU, err)
	}
	if x, _ := life[0].ToString(); x == "1" {
		rp.Retired = true
		return 0, nil
	}
	delisted, _ = life[1].AsInt64()
	return delisted, nil
}

// storeRemaining reads the store's stock of the item into rp. unknown: the store does not know
// the item; it is then compared with nothing and repaired in no way, but its report has Redis's
// figures: the counters and what its undelivered events took.
func (rc *Reconciler) storeRemaining(ctx context.Context, rp *report) (unknown bool, err error) {
	remaining, err := rc.store.Remaining(ctx, parentOf(rp.SKU))
	unknown = errors.Is(err, ErrNotLoaded)
	if err != nil && !unknown {
		return false, fmt.Errorf("stock: reconcile %s: store: %w", rp.SKU, err)
	}
	rp.StoreRemaining = remaining
	return unknown, nil
}

// itemSnapshot is what snapshot.lua read of an item besides its counters: the ids with
// undelivered events and their entries, and the members of the published set.
type itemSnapshot struct {
	entries     map[string]Entry
	ids         []string
	published   []string // published members, to settle those the store has
	transferred int64    // a bucket's net units transferred in (t), read with its counters
}

// unknownToStore reports on rp the item of s, which the store has no row for: none of its
// events applied there, so all of them are in flight, and a human must look.
func (s *itemSnapshot) unknownToStore(rp *report) {
	for _, id := range s.ids {
		rp.InFlight -= redisNet(s.entries[id])
	}
	rp.NeedsHuman = "the store does not know the item"
}

// snapshot reads, in one script, the counters and every event Redis has not seen applied. The
// store is read after it: under the item's lease no relay delivers, and Consume holds the
// item's events back, so the store can only have moved, since the snapshot, by an event the
// snapshot lists (one a consumer began before the pass); the reads of compare see it or not,
// consistently. Too many events: rp.NeedsHuman says so.
func (rc *Reconciler) snapshot(ctx context.Context, k *protocol.Keys, rp *report) (itemSnapshot, error) {
	sku := rp.SKU
	vs, err := protocol.Snapshot.Exec(ctx, rc.r.client, k.ForSnapshot(), []string{strconv.Itoa(maxPending)}).AsStrSlice()
	if err != nil {
		return itemSnapshot{}, fmt.Errorf("stock: reconcile %s: snapshot: %w", sku, err)
	}
	sr, err := protocol.ParseSnapshotReply(vs)
	if err != nil {
		return itemSnapshot{}, fmt.Errorf("%w: reconcile %s: %v", ErrInvalid, sku, err)
	}
	rp.Missing, rp.Available, rp.Held = !sr.Exists, sr.Available, sr.Held
	rp.Pending, rp.DeadLetters, rp.Published = sr.Pending, sr.Dead, sr.Published
	if rp.Pending > maxPending || rp.DeadLetters > maxPending || rp.Published > maxPending {
		rp.NeedsHuman = fmt.Sprintf("%d events pending, %d published, %d dead letters: are a relay and the consumers running?", rp.Pending, rp.Published, rp.DeadLetters)
		return itemSnapshot{}, nil
	}
	// The ids with undelivered events: their effect in Redis (from their entry, read in the
	// same snapshot as the counters).
	snap := itemSnapshot{entries: map[string]Entry{}, transferred: sr.Transferred}
	firstPublished := len(sr.Events) - min(rp.Published, maxPending)
	for i, oe := range sr.Events {
		var e Entry
		err := errors.New("no entry")
		if len(oe.Member) >= 3 && oe.Entry != "" {
			e, err = parseEntry(sku, oe.Member[2:], oe.Entry)
		}
		if err != nil {
			rp.Orphaned++ // the units it took are counted nowhere else
			continue
		}
		if i >= firstPublished {
			snap.published = append(snap.published, oe.Member)
		}
		if _, dup := snap.entries[e.ID]; !dup {
			snap.entries[e.ID] = e
			snap.ids = append(snap.ids, e.ID)
		}
	}
	return snap, nil
}

// compare sets rp's in-flight units and drift from the snapshot and the store's records of its
// ids, and settles the published events the store has. expected is what Redis's available and
// held stock should be. rp.Busy: the store's records kept changing, nothing was compared.
func (rc *Reconciler) compare(ctx context.Context, rp *report, snap itemSnapshot) (expected int64, err error) {
	expected, recs, err := rc.compareOnly(ctx, rp, snap)
	if err != nil || rp.Busy {
		return expected, err
	}
	if len(snap.published) > 0 && !rc.dry {
		if err := rc.settle(ctx, rp, snap.published, snap.entries, recs); err != nil {
			return 0, err
		}
	}
	return expected, nil
}

// compareOnly is compare without the settling of published events; it returns the store's
// records of the snapshot's ids.
func (rc *Reconciler) compareOnly(ctx context.Context, rp *report, snap itemSnapshot) (expected int64, recs map[string]Record, err error) {
	recs, stable, err := rc.storeState(ctx, rp, snap.ids)
	if err != nil {
		return 0, nil, err
	}
	if !stable {
		rp.Busy = true
		return 0, nil, nil
	}
	for _, id := range snap.ids {
		rp.InFlight += stillToApply(recs[id], snap.entries[id])
	}
	expected = rp.StoreRemaining - rp.InFlight
	if rp.Missing {
		rp.Drift = -expected
	} else {
		rp.Drift = rp.Available + rp.Held - expected
	}
	return expected, recs, nil
}

// repair mends the drift, if it may: rebuilds a lost item hash, or adjusts the available stock
// by the drift; an item whose hash is lost with no drift is recreated all the same.
func (rc *Reconciler) repair(ctx context.Context, k *protocol.Keys, rp *report, expected int64) error {
	switch {
	case rp.Orphaned > 0:
		rp.NeedsHuman = fmt.Sprintf("%d undelivered events have lost their ledger entries (see the dead-letter set): "+
			"the units they took are counted nowhere else, so the item is not repaired until an operator settles them", rp.Orphaned)
	case rp.Drift == 0 && rc.restocked == 0 && rc.sold == 0:
	case rc.limit > 0 && abs(rp.Drift) > rc.limit:
		rp.NeedsHuman = fmt.Sprintf("drift %d above the repair limit %d", rp.Drift, rc.limit)
	case rc.dry:
	case rp.Missing:
		live, err := rc.rebuild(ctx, k, rp, max(expected, 0))
		if err != nil {
			return err
		}
		switch {
		case expected < 0:
			rp.NeedsHuman = fmt.Sprintf("the store and the pending events say %d units: oversold", expected)
		case rp.Rebuilt && live > expected:
			rp.NeedsHuman = fmt.Sprintf("live holds of %d units exceed the %d units the store has: oversold by %d", live, expected, live-expected)
		}
	default:
		o, err := decodeOne(protocol.Adjust.Exec(ctx, rc.r.client, k.ForAdjust(), rc.adjustArgs(-rp.Drift)))
		rc.r.noteEvents(rp.SKU)
		if err == nil && o.code == protocol.Invalid {
			err = fmt.Errorf("%w: adjust by %d", ErrInvalid, -rp.Drift)
		}
		if err != nil {
			return fmt.Errorf("stock: reconcile %s: adjust: %w", rp.SKU, err)
		}
		rp.Adjusted = o.remaining
		if o.code == protocol.NotLoaded {
			rp.NeedsHuman = "the item's keys vanished during the pass"
		} else if o.remaining != -rp.Drift {
			rp.NeedsHuman = fmt.Sprintf("Redis had sold %d units more than the store has", rp.Drift+o.remaining)
		}
	}
	if rp.Missing && !rp.Rebuilt && rp.Drift == 0 && !rc.dry && rp.Orphaned == 0 {
		// An empty item (the store has 0 and nothing is pending): recreate it all the same.
		if _, err := rc.rebuild(ctx, k, rp, 0); err != nil {
			return err
		}
	}
	return nil
}

// adjustArgs are adjust.lua's arguments: the delta to the available stock, and the units of the
// restocks and of the sales the pass wrote back, which it counts first; once given, they are
// spent (a split item's later buckets get the rest of the delta alone).
func (rc *Reconciler) adjustArgs(delta int64) []string {
	args := []string{strconv.FormatInt(delta, 10), strconv.FormatInt(rc.restocked, 10), strconv.FormatInt(rc.sold, 10)}
	rc.restocked, rc.sold = 0, 0
	return args
}

// decodeInts decodes a reply of n integers.
func decodeInts(res rueidis.RedisResult, n int) ([]int64, error) {
	msgs, err := replyArray(res, n)
	if err != nil {
		return nil, err
	}
	v := make([]int64, n)
	for i, m := range msgs {
		if v[i], err = replyInt(m); err != nil {
			return nil, fmt.Errorf("%w: malformed script reply: %v", ErrUnknownOutcome, err)
		}
	}
	return v, nil
}

// rebuild recreates a lost item hash with available units, counting as sold what its surviving
// ledger says. live: the units of live holds that survived the loss of the hash.
func (rc *Reconciler) rebuild(ctx context.Context, k *protocol.Keys, rp *report, available int64) (live int64, err error) {
	sold, err := rc.soldInLedger(ctx, rp.SKU)
	if err != nil {
		return 0, err
	}
	args := []string{strconv.FormatInt(available, 10), strconv.FormatInt(sold, 10)}
	o, err := decodeOne(protocol.Rebuild.Exec(ctx, rc.r.client, k.ForRebuild(), args))
	rc.r.noteEvents(rp.SKU)
	if err != nil {
		return 0, fmt.Errorf("stock: reconcile %s: rebuild: %w", rp.SKU, err)
	}
	rp.Rebuilt = o.code == protocol.OK
	return o.qty, nil
}

// conclude registers the item again if Redis lost it from its registry, retires a delisted
// item whose retention has passed, and reports dead letters.
func (rc *Reconciler) conclude(ctx context.Context, k *protocol.Keys, rp *report, delisted int64) error {
	if err := rc.register(ctx, rp); err != nil {
		return err
	}
	if delisted > 0 && rc.retention > 0 && !rc.dry && rp.Drift == 0 && rp.Pending == 0 && rp.Published == 0 && rp.DeadLetters == 0 && !rp.Missing {
		if err := rc.retire(ctx, k, rp, delisted); err != nil {
			return err
		}
	}
	if rp.DeadLetters > 0 && rp.NeedsHuman == "" {
		rp.NeedsHuman = fmt.Sprintf("%d events the store rejected as invalid wait in the dead-letter set", rp.DeadLetters)
	}
	return nil
}

// storeState reads the store's remaining stock and its records of ids, consistently: records,
// remaining, records again, until both reads of the records agree (a consumer that began
// applying one of the events before the pass may finish during it). stable is false if they
// never did.
func (rc *Reconciler) storeState(ctx context.Context, rp *report, ids []string) (recs map[string]Record, stable bool, err error) {
	records := func() (map[string]Record, error) {
		if len(ids) == 0 {
			return map[string]Record{}, nil
		}
		m, err := rc.store.Records(ctx, parentOf(rp.SKU), ids)
		if err != nil {
			return nil, fmt.Errorf("stock: reconcile %s: store records: %w", rp.SKU, err)
		}
		return m, nil
	}
	for try := range 20 {
		before, err := records()
		if err != nil {
			return nil, false, err
		}
		if rp.StoreRemaining, err = rc.store.Remaining(ctx, parentOf(rp.SKU)); err != nil {
			return nil, false, fmt.Errorf("stock: reconcile %s: store: %w", rp.SKU, err)
		}
		if len(ids) == 0 {
			return before, true, nil
		}
		after, err := records()
		if err != nil {
			return nil, false, err
		}
		if sameRecords(before, after) {
			return after, true, nil
		}
		rc.refresh(ctx, rp.SKU)
		select {
		case <-ctx.Done():
			return nil, false, ctx.Err()
		case <-time.After(time.Duration(5+5*try) * time.Millisecond):
		}
	}
	return nil, false, nil
}

func sameRecords(a, b map[string]Record) bool {
	if len(a) != len(b) {
		return false
	}
	for id, ra := range a {
		rb, ok := b[id]
		if !ok || ra.Status != rb.Status || ra.Type != rb.Type || ra.Qty != rb.Qty {
			return false
		}
	}
	return true
}

// settle acknowledges, for a consumer, the published events the store has applied: Redis lost
// the consumer's acknowledgement (a failover), or the consumer died between the two and the
// queue will not deliver them again. Left in the published set they would be applied again
// (harmlessly) by the next Consume of the item, and an item's last events would stay there for
// good. A deduct the store refused is left to its consumer (Consume gives the stock back
// first) unless Redis has given it back already.
func (rc *Reconciler) settle(ctx context.Context, rp *report, members []string, entries map[string]Entry, recs map[string]Record) error {
	var done []string
	for _, m := range members {
		id := m[2:]
		rec, ok := recs[id]
		if !ok {
			continue
		}
		e := entries[id]
		switch m[0] {
		case protocol.EventDeducted:
			ok = (rec.Type == EventDeducted || rec.Type == EventConfirmed) &&
				(rec.Status != StateRefused || e.State == StateRefused)
		case protocol.EventRestocked:
			ok = rec.Type == EventRestocked
		case protocol.EventRestored:
			ok = rec.Status == StateRestored || rec.Status == StateRefused
		default:
			ok = false
		}
		if ok {
			done = append(done, m)
		}
	}
	if len(done) == 0 {
		return nil
	}
	if err := rc.r.ack(ctx, rp.SKU, ackApplied, done); err != nil {
		return fmt.Errorf("stock: reconcile %s: settle published events: %w", rp.SKU, err)
	}
	rp.Settled += len(done)
	return nil
}

// redisNet is what an entry did to Redis's available + held stock.
func redisNet(e Entry) int64 {
	switch {
	case e.Kind == KindRestock && (e.State == StateReserved || e.State == StateApplied):
		return e.Qty
	case e.Kind == KindRestock, e.State == StateHeld:
		return 0
	case e.State == StateReserved || e.State == StateApplied:
		return -e.Qty
	}
	return 0
}

// stillToApply is what delivering the events of e will still change in the store: e's effect in
// Redis less what the store's record of the id did. A record of the other kind (a restock's id
// reused by a sale after its entry was trimmed, or a sale's by a restock) is of an earlier use of
// the id: the store keeps it and ignores the new use's events, so they change nothing there.
func stillToApply(rec Record, e Entry) int64 {
	if rec.ID != "" && otherUse(rec, e) {
		return 0
	}
	return storeNet(rec) - redisNet(e)
}

// otherUse tells whether rec records another kind of request than e: a restock and a sale.
func otherUse(rec Record, e Entry) bool {
	return (rec.Type == EventRestocked) != (e.Kind == KindRestock)
}

// storeNet is what a record did to the store's remaining stock (the zero Record: nothing).
func storeNet(r Record) int64 {
	if r.Status != StateApplied {
		return 0
	}
	if r.Type == EventRestocked {
		return r.Qty
	}
	return -r.Qty
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

// ledgerPass walks the Redis ledger in pages: it requeues events the outbox lost, trims
// settled entries past the retention, resyncs sales and holds the store settled, and writes
// back entries the store has and Redis lost.
func (rc *Reconciler) ledgerPass(ctx context.Context, k *protocol.Keys, rp *report) error {
	return rc.ledgerPassIn(ctx, k, rp, map[string]bool{}, true)
}

// ledgerPassIn is ledgerPass, adding the ids it walks to seen; without rerecord it writes back
// nothing (a bucketed item's pass does it once all of its buckets are walked).
func (rc *Reconciler) ledgerPassIn(ctx context.Context, k *protocol.Keys, rp *report, seen map[string]bool, rerecord bool) error {
	cutoff := rc.r.opts.now().Add(-rc.retention).UnixMilli()
	var b ledgerBatch
	lister, canList := rc.store.(RecordLister)
	for e, err := range rc.r.ledgerOf(ctx, rp.SKU) {
		if err != nil {
			return err
		}
		if canList {
			seen[e.ID] = true
		}
		b.add(e, cutoff)
		if b.len() >= ledgerBatchSize {
			rc.refresh(ctx, rp.SKU) // a long ledger: keep the item's lease while the pass goes on
			if err := rc.settleLedger(ctx, k, rp, &b, cutoff); err != nil {
				return err
			}
		}
	}
	if err := rc.settleLedger(ctx, k, rp, &b, cutoff); err != nil {
		return err
	}
	if !canList || !rerecord {
		return nil
	}
	return rc.rerecord(ctx, k, rp, lister, seen, cutoff, 0)
}

// ledgerBatchSize is the number of ids a ledger pass gathers before it acts on them.
const ledgerBatchSize = 256

// ledgerBatch sorts the ids of a page of ledger entries by what a pass may have to do with them.
type ledgerBatch struct {
	reserved []string // taken, not in the store yet: their events must be in the outbox
	restored []string // given back: their restore event must reach a store that applied them
	trim     []string // settled and past the retention
	sold     []string // sold in Redis: has the store given them back?
	held     []string // live holds: has the store confirmed them?
}

func (b *ledgerBatch) add(e Entry, cutoff int64) {
	if e.Kind != KindRestock && (e.State == StateReserved || e.State == StateApplied) {
		b.sold = append(b.sold, e.ID)
	}
	switch e.State {
	case StateHeld:
		b.held = append(b.held, e.ID)
	case StateReserved:
		b.reserved = append(b.reserved, e.ID)
	case StateRestored, StateRefused:
		if e.Kind != KindTombstone {
			b.restored = append(b.restored, e.ID)
		}
	}
	if e.State != StateReserved && e.State != StateHeld && retainedFrom(e).UnixMilli() < cutoff {
		b.trim = append(b.trim, e.ID)
	}
}

func (b *ledgerBatch) len() int {
	return len(b.reserved) + len(b.restored) + len(b.trim) + len(b.sold) + len(b.held)
}

func (b *ledgerBatch) reset() {
	b.reserved, b.restored, b.trim, b.sold, b.held = b.reserved[:0], b.restored[:0], b.trim[:0], b.sold[:0], b.held[:0]
}

// settleLedger acts on a batch of ledger ids, then empties it.
func (rc *Reconciler) settleLedger(ctx context.Context, k *protocol.Keys, rp *report, b *ledgerBatch, cutoff int64) error {
	if err := rc.resyncSold(ctx, k, rp, b.sold); err != nil {
		return err
	}
	// Live holds whose confirm the store has (Redis lost the confirm in a failover after the
	// relay delivered it): make them final as applied, without a new event; those the store
	// gave back after their confirm: release them, without a new event.
	if len(b.held) > 0 {
		if err := rc.resyncHolds(ctx, rp, b.held); err != nil {
			return err
		}
	}
	// Given back in Redis, applied in the store: the restore event was lost; requeue it. Redis
	// is read first, the store after: a consumer that checked the item's turn before this pass
	// took the item may still apply a restore and settle it, and it applies it to the store
	// before it takes it out of Redis, so a restore missing from Redis is already in the store.
	if len(b.restored) > 0 {
		missing, err := rc.restoresMissing(ctx, k, b.restored)
		if err != nil {
			return fmt.Errorf("stock: reconcile %s: restore events: %w", rp.SKU, err)
		}
		var recs map[string]Record
		if len(missing) > 0 {
			if recs, err = rc.store.Records(ctx, parentOf(rp.SKU), missing); err != nil {
				return fmt.Errorf("stock: reconcile %s: store records: %w", rp.SKU, err)
			}
		}
		for _, id := range missing {
			// A restock's record is of an earlier use of the id (the sale reused it after
			// its trim): the store ignores a restore of it.
			if rec, ok := recs[id]; ok && rec.Status == StateApplied && rec.Type != EventRestocked {
				b.reserved = append(b.reserved, id)
			}
		}
	}
	if len(b.reserved) > 0 && !rc.dry {
		n, err := protocol.Requeue.Exec(ctx, rc.r.client, k.ForSnapshot(), b.reserved).AsInt64()
		rc.r.noteEvents(rp.SKU)
		if err != nil {
			return fmt.Errorf("stock: reconcile %s: requeue: %w", rp.SKU, err)
		}
		rp.Requeued += int(n)
	}
	if len(b.trim) > 0 && rc.retention > 0 && !rc.dry {
		trim, err := rc.trimmable(ctx, rp.SKU, b.trim, cutoff)
		if err != nil {
			return err
		}
		if len(trim) > 0 {
			args := append([]string{strconv.FormatInt(cutoff, 10)}, trim...)
			n, err := protocol.Trim.Exec(ctx, rc.r.client, k.ForTrim(), args).AsInt64()
			if err != nil {
				return fmt.Errorf("stock: reconcile %s: trim: %w", rp.SKU, err)
			}
			rp.Trimmed += int(n)
		}
	}
	b.reset()
	return nil
}

// trimmable returns the ids among ids (entries past the retention by Redis's time) whose store
// record, if any, is past it too: rerecord judges a record by the store's time, which is later
// (the relay applied it later), and would write back an entry trimmed before its record aged,
// reporting as lost what a pass removed.
func (rc *Reconciler) trimmable(ctx context.Context, sku string, ids []string, cutoff int64) ([]string, error) {
	if _, ok := rc.store.(RecordLister); !ok {
		return ids, nil // no rerecord without a lister
	}
	recs, err := rc.store.Records(ctx, parentOf(sku), ids)
	if err != nil {
		return nil, fmt.Errorf("stock: reconcile %s: store records: %w", sku, err)
	}
	out := ids[:0:0]
	for _, id := range ids {
		if rec, ok := recs[id]; !ok || rec.At.UnixMilli() < cutoff {
			out = append(out, id)
		}
	}
	return out, nil
}

// restoresMissing returns the ids among ids whose restore event is in none of the item's
// outbox, published set and dead letters.
func (rc *Reconciler) restoresMissing(ctx context.Context, k *protocol.Keys, ids []string) ([]string, error) {
	c := rc.r.client
	cmds := make(rueidis.Commands, 0, 3*len(ids))
	for _, id := range ids {
		m := protocol.Member(protocol.EventRestored, id)
		for _, key := range []string{k.Outbox, k.Published, k.Dead} {
			cmds = append(cmds, c.B().Zscore().Key(key).Member(m).Build())
		}
	}
	res := c.DoMulti(ctx, cmds...)
	var missing []string
	for i, id := range ids {
		found := false
		for _, r := range res[3*i : 3*i+3] {
			err := r.Error()
			if err == nil {
				found = true
			} else if !rueidis.IsRedisNil(err) {
				return nil, err
			}
		}
		if !found {
			missing = append(missing, id)
		}
	}
	return missing, nil
}

// resyncSold gives back, in Redis, the sales among ids that the store has given back (a restore
// or a refusal Redis lost in a failover), without a new event: the store has it.
func (rc *Reconciler) resyncSold(ctx context.Context, k *protocol.Keys, rp *report, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	recs, err := rc.store.Records(ctx, parentOf(rp.SKU), ids)
	if err != nil {
		return fmt.Errorf("stock: reconcile %s: store records: %w", rp.SKU, err)
	}
	for _, id := range ids {
		rec, ok := recs[id]
		if !ok || (rec.Status != StateRestored && rec.Status != StateRefused) {
			continue
		}
		if rc.dry {
			rp.Resynced++
			continue
		}
		reason := protocol.ReasonRestore
		if rec.Status == StateRefused {
			reason = protocol.ReasonRefuse
		}
		o, err := decodeOne(protocol.Restore.Exec(ctx, rc.r.client, k.ForItem(), []string{id, reason, "0"}))
		if err != nil {
			return fmt.Errorf("stock: reconcile %s: resync %s: %w", rp.SKU, id, err)
		}
		if o.code == protocol.OK {
			rp.Resynced++
		}
	}
	return nil
}

// rerecord writes back the entries the store has and Redis lost (a failover), so that a retry
// of the id is a replay and not a second sale. seen: the ids in Redis's ledger.
func (rc *Reconciler) rerecord(ctx context.Context, k *protocol.Keys, rp *report, lister RecordLister, seen map[string]bool, cutoff int64, buckets int) error {
	after := ""
	for {
		recs, err := lister.List(ctx, parentOf(rp.SKU), after, 500)
		if err != nil {
			return fmt.Errorf("stock: reconcile %s: store list: %w", rp.SKU, err)
		}
		pairs := map[*protocol.Keys][]string{} // by the keys that take them: k, or the id's bucket
		for _, rec := range recs {
			after = rec.ID
			if seen[rec.ID] || rec.At.UnixMilli() < cutoff || checkName("id", rec.ID) != nil {
				continue
			}
			if e := lostEntry(rec); e != "" {
				dst := k
				if buckets > 0 {
					b, err := rc.r.bucketFor(ctx, rp.SKU, rec.ID, buckets, true, false)
					if err != nil {
						return err
					}
					dst = rc.r.item(bucketName(rp.SKU, b))
				}
				pairs[dst] = append(pairs[dst], rec.ID, e)
			}
		}
		for dst, p := range pairs {
			if rc.dry {
				break
			}
			v, err := decodeInts(protocol.Rerecord.Exec(ctx, rc.r.client, dst.ForRerecord(), p), 3)
			if err != nil {
				return fmt.Errorf("stock: reconcile %s: rerecord: %w", rp.SKU, err)
			}
			rp.Rerecorded += int(v[0])
			rc.restocked += v[1]
			rc.sold += v[2]
		}
		if len(recs) < 500 {
			return nil
		}
	}
}

// resyncHolds settles the live holds among ids that the store has a record of: confirmed
// there, they are made final in Redis as applied; given back there after their confirm, they
// are released. Neither queues an event: the store has it already.
func (rc *Reconciler) resyncHolds(ctx context.Context, rp *report, ids []string) error {
	sku := rp.SKU
	recs, err := rc.store.Records(ctx, parentOf(sku), ids)
	if err != nil {
		return fmt.Errorf("stock: reconcile %s: store records: %w", sku, err)
	}
	for _, id := range ids {
		rec, ok := recs[id]
		if !ok || rec.Type != EventConfirmed {
			continue // not confirmed anywhere yet: the hold is live
		}
		if rc.dry {
			rp.Resynced++
			continue
		}
		var o outcome
		if rec.Status == StateApplied {
			o, err = decodeOne(protocol.Confirm.Exec(ctx, rc.r.client, rc.r.item(sku).ForItem(), []string{id, "0", "1"}))
		} else {
			o, err = decodeOne(protocol.Restore.Exec(ctx, rc.r.client, rc.r.item(sku).ForItem(), []string{id, protocol.ReasonRestore, "0"}))
		}
		if err != nil {
			return fmt.Errorf("stock: reconcile %s: resync hold %s: %w", sku, id, err)
		}
		// A hold past its deadline is released by the restore and answered as a replay (it had
		// gone back, as far as its owner is concerned): settled all the same.
		if o.code == protocol.OK || (o.code == protocol.Replay && rec.Status != StateApplied) {
			rp.Resynced++
		}
	}
	return nil
}

// lostEntry builds the ledger entry for a store record Redis lost. Before and after are
// unknown (0).
func lostEntry(rec Record) string {
	e := protocol.Entry{Kind: protocol.KindDeduct, State: protocol.StateApplied, Qty: rec.Qty, At: rec.At.UnixMilli(), User: rec.User}
	switch rec.Type {
	case EventConfirmed:
		e.Kind = protocol.KindHold
	case EventRestocked:
		// What was available after it is lost with the entry; the least value a restock of
		// Qty units can have left keeps the entry readable.
		e.Kind, e.After = protocol.KindRestock, rec.Qty
	case EventDeducted:
	default:
		e.Kind = protocol.KindTombstone
	}
	switch rec.Status {
	case StateRestored:
		e.State = protocol.StateRestored
	case StateRefused:
		e.State = protocol.StateRefused
	}
	if e.Kind == protocol.KindTombstone {
		e.State = protocol.StateRestored
	}
	if e.User != "" && checkName("user", e.User) != nil {
		e.User = ""
	}
	return e.Encode()
}

// retire removes a delisted item's keys once its retention has passed, in bounded steps.
// retire.lua checks at every step, atomically, that the item is closed and delisted, with
// nothing pending: the delisting time read by the pass is only a hint.
func (rc *Reconciler) retire(ctx context.Context, k *protocol.Keys, rp *report, delisted int64) error {
	cutoff := rc.r.opts.now().Add(-rc.retention).UnixMilli()
	if delisted > cutoff {
		return nil
	}
	code, err := rc.retireSteps(ctx, rp, rp.SKU, k.ForRetire(), cutoff)
	if err != nil {
		return err
	}
	switch code {
	case protocol.OK:
		rp.Retired = true
	case protocol.Closed: // delisted but open for sale: retire.lua never removes a live item
		rp.NeedsHuman = "the item is delisted but open for sale (reopened before that was refused): Close it to let it retire"
	}
	// Otherwise not retirable now (something pending): a later pass tries again.
	return nil
}

// retireSteps runs retire.lua on the item name (rp.SKU, or a bucket of it) with keys until it
// has retired it or refuses to, and takes a retired item out of the registry. It returns the
// script's last code: OK (retired), CLOSED, CONFLICT or NOTLOADED.
func (rc *Reconciler) retireSteps(ctx context.Context, rp *report, name string, keys []string, cutoff int64) (int64, error) {
	args := []string{strconv.FormatInt(cutoff, 10), "500"}
	for range 10000 {
		code, n, err := decodePair(protocol.Retire.Exec(ctx, rc.r.client, keys, args))
		if err != nil {
			return 0, fmt.Errorf("stock: reconcile %s: retire %s: %w", rp.SKU, name, err)
		}
		rp.Trimmed += int(n)
		if code == protocol.Replay { // more pages
			continue
		}
		if code == protocol.OK {
			if err := rc.unregister(ctx, name); err != nil {
				return 0, fmt.Errorf("stock: reconcile %s: retire %s: %w", rp.SKU, name, err)
			}
		}
		return code, nil
	}
	return protocol.Replay, nil
}

// unregister takes the retired items names out of the registry. A Load may run meanwhile: it
// adds its item to the registry both before and after it creates it, so an item read here as
// loaded again after the removal is put back, and one loaded after this read is put back by
// its Load. Either way a loaded item never stays out of the registry (where the relay would
// miss its events).
func (rc *Reconciler) unregister(ctx context.Context, names ...string) error {
	c := rc.r.client
	if err := c.Do(ctx, c.B().Srem().Key(rc.r.registryKey()).Member(names...).Build()).Error(); err != nil {
		return fmt.Errorf("registry: %w", err)
	}
	cmds := make(rueidis.Commands, len(names))
	for i, name := range names {
		cmds[i] = c.B().Hexists().Key(rc.r.item(name).Item).Field("a").Build()
	}
	var back []string
	for i, res := range c.DoMulti(ctx, cmds...) {
		loaded, err := res.AsBool() // a retired hash keeps only its mark: no available count
		if err != nil {
			return fmt.Errorf("registry: %s: %w", names[i], err)
		}
		if loaded {
			back = append(back, names[i])
		}
	}
	if len(back) > 0 {
		if err := c.Do(ctx, c.B().Sadd().Key(rc.r.registryKey()).Member(back...).Build()).Error(); err != nil {
			return fmt.Errorf("registry: %w", err)
		}
	}
	return nil
}

// lock takes the item's relay lease for the pass, waiting a little for a relay to finish.
//
// A lease that carries this Reconciler's token is taken over: it was left by one of its own
// passes that did not finish (the SET ran but its reply was lost, a pass cut short by a Redis
// restart that kept the lease in its AOF, or a failover that copied it to the new primary),
// and no other pass of this Reconciler runs (rc.pass).
func (rc *Reconciler) lock(ctx context.Context, sku string) (bool, error) {
	key := rc.r.item(sku).Lease
	for i := range 20 {
		ok, err := rc.r.client.Do(ctx, rc.r.client.B().Set().Key(key).Value(rc.token).Nx().Px(reconcileLease).Build()).AsBool()
		if err != nil && !isNil(err) {
			if !brokenConn(err) || i > 0 {
				return false, fmt.Errorf("stock: reconcile %s: lease: %w", sku, err)
			}
			continue // the SET may have run before the connection broke: try again
		}
		if ok {
			return true, nil
		}
		mine, err := protocol.Refresh.Exec(ctx, rc.r.client, []string{key}, []string{rc.token, strconv.FormatInt(reconcileLease.Milliseconds(), 10)}).AsInt64()
		if err == nil && mine == 1 {
			return true, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(time.Duration(5+i*5) * time.Millisecond):
		}
	}
	return false, nil
}

// reconcileLease is how long the reconciler's hold on an item lasts unless refreshed: short, so
// that a lease left behind (the server restarted during a pass and kept it in its AOF) holds
// the item's relay and the failover fence only briefly.
const reconcileLease = 5 * time.Second

// refresh extends the item's lease if it is still ours.
func (rc *Reconciler) refresh(ctx context.Context, sku string) {
	key := rc.r.item(sku).Lease
	_ = protocol.Refresh.Exec(ctx, rc.r.client, []string{key}, []string{rc.token, strconv.FormatInt(reconcileLease.Milliseconds(), 10)}).Error()
}

func (rc *Reconciler) unlock(sku string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	key := rc.r.item(sku).Lease
	// Only our own lease: compare and delete in one step.
	for range 3 { // a broken connection: try again rather than leave the item locked
		if err := protocol.Unlock.Exec(ctx, rc.r.client, []string{key}, []string{rc.token}).Error(); err == nil || ctx.Err() != nil {
			return
		}
	}
}

// soldInLedger counts the units an item's surviving ledger records as sold (deducts and
// confirmed holds, reserved or applied, not given back), for the rebuild of an item whose hash
// was lost: while the hash is missing, no script changes these entries.
func (rc *Reconciler) soldInLedger(ctx context.Context, sku string) (int64, error) {
	var sold int64
	for e, err := range rc.r.entries(ctx, sku) {
		if err != nil {
			return 0, fmt.Errorf("stock: reconcile %s: rebuild: %w", sku, err)
		}
		if (e.Kind == KindDeduct || e.Kind == KindHold) && (e.State == StateReserved || e.State == StateApplied) {
			sold += e.Qty
		}
	}
	return sold, nil
}

type report = Report
