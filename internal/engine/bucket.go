package engine

// Buckets: an item whose stock is split over several cluster slots (WithBuckets), so that one
// hot item is served by several Redis cores. The Reserver's methods send a split item's requests
// here (takeBucketed, levelsBucketed, loadBucketed, the holder of an id); the relay, the
// reconciler (itemBucketed) and stockops walk its buckets (names). What they stand on:
//
//   - A bucket is a hidden item: bucket i of item X is the item named bucketName(X, i),
//     "X|i". Names cannot contain '|', so no item of a user ever meets a bucket, and each
//     bucket's keys carry a hash tag of their own ({X|i|k}, protocol.BucketTag): a slot in the
//     i-th of n equal ranges of the slot space, so that n buckets fall on n masters of a cluster
//     that deals its slots out evenly.
//   - An id lives in one bucket. route claims a bucket for an id in the claims hash of the id's
//     home bucket (homeBucket), and answers the claimed bucket to every later request of the
//     id, whoever sends it. Claims of one home bucket are coalesced (coalesce.go).
//   - A transfer moves stock from one bucket (the donor) to another (the target) exactly once
//     and crash-safely: xout.lua takes the units from the donor and records the transfer there
//     as in flight, xin.lua adds them to the target once per transfer id, xdone.lua ends it in
//     the donor. A transfer cut by a crash after xout is always completed, never undone
//     (recoverTransfers): adding stock to the target cannot fail for lack of anything. Each
//     bucket keeps t, its net units transferred in, so that available + held + sold - t is
//     its loaded count, and the sum over the buckets of available - t is the item's available
//     stock whatever transfers are in flight, at whatever moments the buckets are read.
//   - A transfer is a barrier for the relay: xout records the donor's outbox sequence with it,
//     xin adds a barrier to the target, and the relay (and Consume) delivers the target's later
//     events only after the donor's events up to that sequence (relay.go, barrierCut).

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
	"github.com/stockres/stock/internal/protocol"
)

// bucketName is the name of bucket i of item sku.
func bucketName(sku string, i int) string {
	return sku + "|" + strconv.Itoa(i)
}

// bucketOf returns the bucket of n that key (a user, or a request id) goes to: FNV-1a of the
// key, mod n.
func bucketOf(key string, n int) int {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return int(h % uint32(n))
}

// homeBucket is the bucket whose claims hash holds the bucket of request id.
func homeBucket(id string, n int) int { return bucketOf(id, n) }

// route returns the bucket of request id on item sku of n buckets: the bucket an earlier request
// of the id claimed, or want, which this call then claims; and whether the claim was made by a
// give-back (a restore or a cancel, giveBack here), whose tombstone a late take of another
// bucket must answer with ErrRestored even before the tombstone is written.
func (r *Reserver) route(ctx context.Context, sku, id string, n, want int, giveBack bool) (b int, byGiveBack bool, err error) {
	home := r.item(bucketName(sku, homeBucket(id, n)))
	claim := strconv.Itoa(want)
	if giveBack {
		claim += "r"
	}
	var s string
	if r.opts.inflight > 0 {
		s, err = r.claims.Do(ctx, home.Claims, claimReq{id, claim}, r.opts.inflight)
	} else {
		var out [1]string
		err = r.execClaims(ctx, home.Claims, []claimReq{{id, claim}}, out[:])
		s = out[0]
	}
	if err != nil {
		return 0, false, fmt.Errorf("stock: route %s/%s: %w", sku, id, err)
	}
	return parseClaim(sku, id, s, n)
}

// parseClaim reads a claim: the bucket's index, followed by "r" when a give-back made it.
func parseClaim(sku, id, s string, n int) (b int, byGiveBack bool, err error) {
	t, byGiveBack := strings.CutSuffix(s, "r")
	b, err = strconv.Atoi(t)
	if err != nil || b < 0 || b >= n {
		return 0, false, fmt.Errorf("%w: route %s/%s: the claims hash names bucket %q of %d", ErrInvalid, sku, id, s, n)
	}
	return b, byGiveBack, nil
}

// newTransferID returns a new transfer id: 16 random hex digits.
func newTransferID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// transfer moves up to want units of item sku from bucket from to bucket to, and at least least
// of them (none when the donor has fewer), under transfer id tid. It returns the units moved. An
// error after the donor gave its units leaves the transfer in flight in the donor, for
// recoverTransfers (or a call of transfer with the same tid) to complete.
func (r *Reserver) transfer(ctx context.Context, sku, tid string, from, to int, want, least int64) (int64, error) {
	if from == to || want < 1 || least < 1 || least > want {
		return 0, invalid("transfer %s: buckets %d -> %d of %d units (at least %d)", sku, from, to, want, least)
	}
	donor := r.item(bucketName(sku, from))
	res, _ := r.exec(ctx, protocol.XOut, donor.ForXOut(),
		[]string{tid, strconv.Itoa(to), strconv.FormatInt(want, 10), strconv.FormatInt(least, 10)})
	o, err := decodeXOut(res)
	if err != nil {
		return 0, fmt.Errorf("stock: transfer %s %s: out of bucket %d: %w", sku, tid, from, err)
	}
	switch o.code {
	case protocol.OK, protocol.Replay:
	case protocol.Short:
		return 0, nil
	default:
		return 0, fmt.Errorf("stock: transfer %s %s: out of bucket %d: %w", sku, tid, from, codeErr(o.code))
	}
	k, seq := o.remaining, o.seq // xout answers the units taken and the donor's sequence
	// Should this process die before the transfer ends, the sweeper finds it by this hint.
	r.noteHold(bucketName(sku, from))
	if err := r.transferIn(ctx, sku, tid, from, to, k, seq); err != nil {
		return 0, err
	}
	return k, nil
}

// xoutOutcome is xout.lua's reply.
type xoutOutcome struct{ code, remaining, avail, seq int64 }

// decodeXOut decodes xout.lua's reply: code, units taken, available left, the donor's sequence.
func decodeXOut(res rueidis.RedisResult) (xoutOutcome, error) {
	msgs, err := replyArray(res, 4)
	if err != nil {
		return xoutOutcome{}, err
	}
	var v [4]int64
	for i := range v {
		if v[i], err = replyInt(msgs[i]); err != nil {
			return xoutOutcome{}, fmt.Errorf("%w: malformed script reply, value %d: %v", ErrUnknownOutcome, i, err)
		}
	}
	if v[3] < 0 {
		return xoutOutcome{}, fmt.Errorf("%w: malformed script reply: sequence %d", ErrUnknownOutcome, v[3])
	}
	return xoutOutcome{code: v[0], remaining: v[1], avail: v[2], seq: v[3]}, nil
}

// transferIn completes transfer tid of k units from bucket from to bucket to: the target adds
// them (once), with a barrier that orders its later events after the donor's events up to seq,
// the donor's sequence when it gave the units (see xin.lua); then the donor ends the transfer.
func (r *Reserver) transferIn(ctx context.Context, sku, tid string, from, to int, k, seq int64) error {
	donor, target := r.item(bucketName(sku, from)), r.item(bucketName(sku, to))
	res, _ := r.exec(ctx, protocol.XIn, target.ForXIn(), []string{tid, strconv.Itoa(from), strconv.FormatInt(k, 10), strconv.FormatInt(seq, 10)})
	o, err := decodeOne(res)
	if err != nil {
		return fmt.Errorf("stock: transfer %s %s: into bucket %d: %w", sku, tid, to, err)
	}
	if o.code != protocol.OK && o.code != protocol.Replay {
		return fmt.Errorf("stock: transfer %s %s: into bucket %d: %w", sku, tid, to, codeErr(o.code))
	}
	code, err := decodeCode(protocol.XDone.Exec(ctx, r.client, donor.ForXDone(), []string{tid}))
	if err != nil {
		return fmt.Errorf("stock: transfer %s %s: end in bucket %d: %w", sku, tid, from, err)
	}
	if code != protocol.OK && code != protocol.Replay {
		return fmt.Errorf("stock: transfer %s %s: end in bucket %d: %w", sku, tid, from, codeErr(code))
	}
	return nil
}

// recoverTransfers completes the transfers out of bucket from of item sku (of n buckets) that
// began more than olderThan ago (by Redis's clock) and are still in flight: a process died
// between their halves. It returns how many it completed.
func (r *Reserver) recoverTransfers(ctx context.Context, sku string, from, n int, olderThan time.Duration) (int, error) {
	donor := r.item(bucketName(sku, from))
	now, err := r.serverNow(ctx)
	if err != nil {
		return 0, fmt.Errorf("stock: recover transfers of %s: %w", sku, err)
	}
	cutoff := strconv.FormatInt(now.Add(-olderThan).UnixMilli(), 10)
	tids, err := r.client.Do(ctx, r.client.B().Zrange().Key(donor.InFlight).Min("-inf").Max(cutoff).Byscore().Limit(0, 100).Build()).AsStrSlice()
	if err != nil {
		return 0, fmt.Errorf("stock: recover transfers of %s: %w", sku, err)
	}
	done := 0
	for _, tid := range tids {
		x, err := r.client.Do(ctx, r.client.B().Hget().Key(donor.Transfers).Field(tid).Build()).ToString()
		if err != nil {
			return done, fmt.Errorf("stock: recover transfer %s %s: %w", sku, tid, err)
		}
		x2, err := protocol.ParseTransfer(x)
		if err != nil || x2.Dir != 'O' || x2.Other < 0 || x2.Other >= n || x2.Other == from {
			return done, fmt.Errorf("%w: recover transfer %s %s: entry %q in bucket %d", ErrInvalid, sku, tid, x, from)
		}
		if err := r.transferIn(ctx, sku, tid, from, x2.Other, x2.Units, x2.Seq); err != nil {
			return done, err
		}
		done++
	}
	return done, nil
}

// decodeCode decodes a one-integer reply ({code}).
func decodeCode(res rueidis.RedisResult) (int64, error) {
	msgs, err := replyArray(res, 1)
	if err != nil {
		return 0, err
	}
	code, err := replyInt(msgs[0])
	if err != nil {
		return 0, fmt.Errorf("%w: malformed script reply: %v", ErrUnknownOutcome, err)
	}
	return code, nil
}

// maxBuckets is the most buckets an item may be split into.
const maxBuckets = 64

// maxRebalance is how many times a take refused for stock in its bucket moves stock from the
// other buckets and tries again before one last take answers.
const maxRebalance = 32

// bucketsOf returns the number of buckets of item sku: 0 when it is not bucketed.
func (r *Reserver) bucketsOf(sku string) int {
	if r.opts.buckets == nil {
		return 0
	}
	if n := r.opts.buckets(sku); n >= 2 {
		return min(n, maxBuckets)
	}
	return 0
}

// bucketFor returns the bucket that holds id of item sku (of n buckets): the one its claim names,
// or its home bucket when no request claimed one. With claim, a missing claim is made for the
// home bucket (a restore or a cancel of an unknown id leaves its tombstone there, where a late
// request of the id is sent).
func (r *Reserver) bucketFor(ctx context.Context, sku, id string, n int, claim, giveBack bool) (int, error) {
	home := homeBucket(id, n)
	if claim {
		b, _, err := r.route(ctx, sku, id, n, home, giveBack)
		return b, err
	}
	s, err := r.client.Do(ctx, r.client.B().Hget().Key(r.item(bucketName(sku, home)).Claims).Field(id).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return home, nil
	}
	if err != nil {
		return 0, fmt.Errorf("stock: route %s/%s: %w", sku, id, err)
	}
	b, _, err := parseClaim(sku, id, s, n)
	return b, err
}

// takeBucketed is Deduct (kind "D") and Hold ("H") of a checked request on an item of n buckets.
// The request goes to its buyer's bucket (its id's without a buyer) unless another request
// claimed the id for another bucket; a refusal for stock there moves stock from the other
// buckets and tries again, so that a request is refused for stock only when the buckets as a
// whole could not serve it. The first tries go without Request.Retry, so that a refusal they
// get writes nothing; the last carries the caller's.
func (r *Reserver) takeBucketed(ctx context.Context, kind string, req Request, ttlMs int64, n int) (_ Receipt, err error) {
	known, ok, mark := r.takeBucketedFast(ctx, req, n) // the sold-out fast path (fastpath.go)
	if ok {
		return known, ErrSoldOut
	}
	defer mark(&err)
	rc := Receipt{SKU: req.SKU, ID: req.ID}
	want := bucketOf(req.ID, n)
	if req.User != "" {
		want = bucketOf(req.User, n)
	}
	b, byGiveBack, err := r.route(ctx, req.SKU, req.ID, n, want, false)
	if err != nil {
		return rc, err
	}
	if b != want {
		return r.claimedElsewhere(ctx, rc, kind, req, b, byGiveBack)
	}
	bq := req
	bq.SKU, bq.Retry = bucketName(req.SKU, b), false
	k := r.item(bq.SKU)
	last := false // the take that decides: sent after the last move of stock, with the caller's Retry
	for try := 0; ; try++ {
		var o outcome
		var ackErr error
		if kind == protocol.TakeDeduct && r.opts.inflight > 0 {
			o, err = r.deducts.Do(ctx, bq.SKU, bq, r.opts.inflight)
		} else {
			o, ackErr, err = r.takeScript(ctx, k, kind, bq, ttlMs)
		}
		if err != nil {
			return rc, fmt.Errorf("stock: deduct %s/%s: %w", rc.SKU, rc.ID, err)
		}
		if o.code == protocol.Conflict {
			rc, _ = r.receiptAck(rc, o, ackErr)
			return rc, r.conflict(ctx, k.Ledger, rc, takeWant(kind, req))
		}
		if o.code != protocol.SoldOut && o.code != protocol.Short || last {
			return r.receiptAck(rc, o, ackErr)
		}
		// Stock is moved in while the item has enough; when it has not (or after maxRebalance
		// rounds lost to other requests), one more take answers: it sees what other requests
		// of the bucket moved in meanwhile, and a copy of this request that took the stock (a
		// replay).
		moved, item := r.rebalance(ctx, req.SKU, n, b, req.Qty-max(o.remaining, 0))
		if (moved == 0 && item < req.Qty) || try >= maxRebalance {
			last, bq.Retry = true, req.Retry
		}
	}
}

// claimedElsewhere answers a take whose id an earlier request claimed for bucket b, another
// than the take's own: by another buyer, or by a restore that overtook the take. As on a plain
// item, a tombstone answers ErrRestored (the recorded refusal of a retry: ErrSoldOut or
// ErrInsufficient, as the retry was told), and an entry ErrConflict with the quantity the id
// was first used with (rc.Qty). With no entry yet, a
// claim of a give-back is a restore whose tombstone is on its way (ErrRestored); any other is
// another buyer's, whose request is on its way or was refused for stock (ErrConflict).
func (r *Reserver) claimedElsewhere(ctx context.Context, rc Receipt, kind string, req Request, b int, byGiveBack bool) (Receipt, error) {
	s, err := r.client.Do(ctx, r.client.B().Hget().Key(r.item(bucketName(req.SKU, b)).Ledger).Field(req.ID).Build()).ToString()
	if err != nil && !rueidis.IsRedisNil(err) {
		return rc, fmt.Errorf("stock: deduct %s/%s: %w", req.SKU, req.ID, err)
	}
	if err == nil {
		e, err := parseEntry(req.SKU, req.ID, s)
		if err != nil {
			return rc, err
		}
		if e.Kind == KindTombstone {
			rc.Qty = req.Qty
			if e.State == StateRefused { // a retry's recorded refusal, answered as it was then
				rc.Remaining = e.After
				if e.After > 0 {
					return rc, ErrInsufficient
				}
				return rc, ErrSoldOut
			}
			return rc, ErrRestored
		}
		rc.Qty = e.Qty
		if d := conflictDetail(e, takeWant(kind, req)); d != "" {
			return rc, fmt.Errorf("%w: %s/%s %s", ErrConflict, req.SKU, req.ID, d)
		}
		return rc, fmt.Errorf("%w: %s/%s was used with other parameters (quantity %d)", ErrConflict, req.SKU, req.ID, e.Qty)
	}
	if byGiveBack {
		rc.Qty = req.Qty
		return rc, ErrRestored
	}
	return rc, fmt.Errorf("%w: %s/%s was used by another user", ErrConflict, req.SKU, req.ID)
}

// rebalance moves stock of item sku (of n buckets) into bucket b from the others, at least need
// units if they have them, and returns the units moved and the item's available stock when read
// (every bucket's, in flight included). A donor gives what is asked or, when more, half of its
// stock, so that a bucket that runs dry (its buyers outnumber the others') does not come back
// at once. Errors are logged: a transfer cut half way is completed by recoverTransfers.
func (r *Reserver) rebalance(ctx context.Context, sku string, n, b int, need int64) (moved, item int64) {
	need = max(need, 1)
	// read returns each bucket's available units (-1 when unreadable), whether it has live
	// holds, and the item's available stock: the sum of available - t (net units transferred
	// in), which counts the units of a transfer in flight, whatever moments the buckets are read
	// at.
	read := func() (avail []int64, holds []bool, item int64) {
		cmds := make(rueidis.Commands, 0, n)
		for i := range n {
			cmds = append(cmds, r.client.B().Hmget().Key(r.item(bucketName(sku, i)).Item).Field("a", "n", "t").Build())
		}
		avail, holds = make([]int64, n), make([]bool, n)
		for i, res := range r.client.DoMulti(ctx, cmds...) {
			avail[i] = -1
			if vs, err := res.ToArray(); err == nil && len(vs) == 3 {
				if a, err := vs[0].AsInt64(); err == nil {
					avail[i] = a
					t, _ := vs[2].AsInt64() // absent: 0
					item += a - t
				}
				holds[i] = !vs[1].IsNil()
			}
		}
		return avail, holds, item
	}
	avail, holds, item := read()
	// Holds past their deadline in the other buckets are released first, as a plain item's
	// request releases its due holds before it refuses (a sweep releases the due ones only).
	swept := false
	for i := range n {
		if i != b && holds[i] {
			if k, err := r.sweep(ctx, bucketName(sku, i)); err == nil && k > 0 {
				swept = true
			}
		}
	}
	if swept {
		avail, _, item = read()
	}
	type donor struct {
		i int
		a int64
	}
	var donors []donor
	for i, a := range avail {
		if i != b && a > 0 {
			donors = append(donors, donor{i, a})
		}
	}
	slices.SortFunc(donors, func(x, y donor) int { return cmp.Compare(y.a, x.a) })
	for _, d := range donors {
		if moved >= need {
			break
		}
		k, err := r.transfer(ctx, sku, newTransferID(), d.i, b, max(need-moved, d.a/2), 1)
		if err != nil {
			r.opts.logger.WarnContext(ctx, "stock: moving stock between buckets", "sku", sku, "from", d.i, "to", b, "err", err)
			continue
		}
		moved += k
	}
	return moved, item
}

// levelsBucketed is Levels of an item of n buckets: the sums of the buckets' counters, with
// Available the sum of available - t (a bucket's net units transferred in), which counts the
// units of a transfer in flight once whatever moments the buckets are read at.
func (r *Reserver) levelsBucketed(ctx context.Context, sku string, n int) (Levels, error) {
	cmds := make(rueidis.Commands, 0, n)
	for i := range n {
		cmds = append(cmds, r.client.B().Hmget().Key(r.item(bucketName(sku, i)).Item).Field("a", "h", "s", "l", "c", "t").Build())
	}
	var l Levels
	for i, res := range r.client.DoMulti(ctx, cmds...) {
		vs, err := res.ToArray()
		if err != nil {
			return Levels{}, fmt.Errorf("stock: levels %s: bucket %d: %w", sku, i, err)
		}
		if len(vs) != 6 || vs[0].IsNil() {
			return Levels{}, fmt.Errorf("%w: %s (bucket %d)", ErrNotLoaded, sku, i)
		}
		var f [6]int64
		for j, v := range vs {
			if j == 4 || v.IsNil() {
				continue
			}
			if f[j], err = v.AsInt64(); err != nil {
				return Levels{}, fmt.Errorf("%w: levels %s: bucket %d field %d: %v", ErrInvalid, sku, i, j, err)
			}
		}
		closed, _ := vs[4].ToString()
		l.Available += f[0] - f[5]
		l.Held += f[1]
		l.Sold += f[2]
		l.Loaded += f[3]
		l.Closed = l.Closed || closed == "1"
	}
	return l, nil
}

// loadBucketed is Load of an item of n buckets: qty split over them, the first qty mod n
// buckets one unit more. A load cut half way is finished by calling Load again; ErrLoaded only
// when every bucket existed, or (before anything is written) when a bucket is delisted and not
// retired yet (bucketretire.go).
func (r *Reserver) loadBucketed(ctx context.Context, sku string, qty int64, n int) error {
	// An item Redis has as a plain item (loaded by a Reserver without WithBuckets) is loaded:
	// buckets beside it would sell its stock twice.
	// A plain item's hash that is retired (only its retirement mark left) or holds only its
	// outbox sequence is no item: the stock may be loaded again, split.
	vs, err := r.client.Do(ctx, r.client.B().Hmget().Key(r.item(sku).Item).Field("a", "x").Build()).ToArray()
	if err != nil {
		return fmt.Errorf("stock: load %s: %w", sku, err)
	}
	if len(vs) == 2 && !vs[0].IsNil() {
		if x, _ := vs[1].ToString(); x != "1" {
			return fmt.Errorf("%w: %s is an item Redis does not split over buckets", ErrLoaded, sku)
		}
	}
	if err := r.refuseLoad(ctx, sku, n); err != nil {
		return err
	}
	// Registry first (see Load), and again after the buckets are created: a reconcile pass that
	// found them retired may have taken them out meanwhile (reconciler.unregister).
	names := r.names(sku)
	register := func() error {
		if err := r.client.Do(ctx, r.client.B().Sadd().Key(r.registryKey()).Member(names...).Build()).Error(); err != nil {
			return fmt.Errorf("stock: load %s: %w", sku, err)
		}
		return nil
	}
	if err := register(); err != nil {
		return err
	}
	existed := 0
	for i := range n {
		q := qty / int64(n)
		if int64(i) < qty%int64(n) {
			q++
		}
		code, _, err := decodePair(protocol.Load.Exec(ctx, r.client, r.item(bucketName(sku, i)).ForLoad(), []string{strconv.FormatInt(q, 10)}))
		if err != nil {
			return fmt.Errorf("stock: load %s bucket %d: %w", sku, i, err)
		}
		if code == protocol.Replay {
			existed++
		} else if err := codeErr(code); err != nil {
			return err
		}
	}
	if existed == n {
		return fmt.Errorf("%w: %s", ErrLoaded, sku)
	}
	return register()
}

// restockLimit is the most bucket name of item sku (of n buckets) may hold after a restock, for
// the item to hold at most MaxQty: MaxQty less the loaded counts of the other buckets (negative
// when they already hold more, which restock.lua refuses). A bucket's loaded count is its share
// of Levels.Loaded, which transfers leave alone. ErrNotLoaded when another bucket is missing: its
// share is unknown (a Load cut half way, which Load finishes), as Levels says too.
func (r *Reserver) restockLimit(ctx context.Context, sku, name string, n int) (int64, error) {
	_, own := splitBucket(name)
	cmds := make(rueidis.Commands, 0, n-1)
	others := make([]int, 0, n-1)
	for i := range n {
		if i != own {
			cmds = append(cmds, r.client.B().Hmget().Key(r.item(bucketName(sku, i)).Item).Field("a", "l").Build())
			others = append(others, i)
		}
	}
	limit := int64(MaxQty)
	for j, res := range r.client.DoMulti(ctx, cmds...) {
		i := others[j]
		vs, err := res.ToArray()
		if err != nil {
			return 0, fmt.Errorf("stock: restock %s: bucket %d: %w", sku, i, err)
		}
		if len(vs) != 2 || vs[0].IsNil() {
			return 0, fmt.Errorf("%w: %s (bucket %d)", ErrNotLoaded, sku, i)
		}
		l, err := vs[1].AsInt64()
		if err == nil && (l < 0 || l > MaxQty) {
			err = fmt.Errorf("%d out of range [0, %d]", l, int64(MaxQty))
		}
		if err != nil {
			return 0, fmt.Errorf("%w: restock %s: bucket %d: loaded count: %v", ErrInvalid, sku, i, err)
		}
		limit -= l // cannot overflow: each term is in [0, MaxQty]
	}
	return limit, nil
}

// holder returns the name of the item whose keys hold id of item sku: sku itself, or the bucket
// the id was routed to.
func (r *Reserver) holder(ctx context.Context, sku, id string) (string, error) {
	return r.claimer(ctx, sku, id, false, false)
}

// claimer is holder, claiming the id's home bucket for it when no request did (claim; a
// give-back's claim with giveBack): the item whose keys a restore, a cancel or a restock of id
// writes to.
func (r *Reserver) claimer(ctx context.Context, sku, id string, claim, giveBack bool) (string, error) {
	n := r.bucketsOf(sku)
	if n == 0 {
		return sku, nil
	}
	b, err := r.bucketFor(ctx, sku, id, n, claim, giveBack)
	if err != nil {
		return "", err
	}
	return bucketName(sku, b), nil
}

// parentOf returns the item a bucket belongs to ("X" for "X|2"), or name itself for an item
// that is not a bucket.
func parentOf(name string) string {
	sku, _ := splitBucket(name)
	return sku
}

// itemBucketed is one reconcile pass of an item of n buckets (Item), under every bucket's
// lease: each bucket's ledger pass (lost events, resyncs, trimming) against the store's records
// of the item, the entries the store has and every bucket lost written back to their buckets, a
// snapshot of each bucket, and the comparison of their sum with the store. Each bucket's
// snapshot is read at one instant, and the store stands still under the leases, so the sum is
// consistent whatever the buckets sold between the snapshots; a bucket counts available - t,
// which a transfer in flight does not change. A drift is mended in the buckets' available
// stock; a bucket whose hash is lost is left to a human.
func (rc *Reconciler) itemBucketed(ctx context.Context, sku string, n int) (rp report, err error) {
	rp = report{SKU: sku}
	var locked []string
	defer func() {
		for _, name := range locked {
			rc.unlock(name)
		}
	}()
	for i := range n {
		name := bucketName(sku, i)
		ok, err := rc.lock(ctx, name)
		if err != nil {
			rc.unlock(name)
			return rp, err
		}
		if !ok {
			rp.Busy = true
			return rp, nil
		}
		locked = append(locked, name)
	}
	life, done, err := rc.bucketLifecycle(ctx, sku, n, &rp) // retired, or partly (bucketretire.go)
	if err != nil || done {
		return rp, err
	}
	unknown, err := rc.storeRemaining(ctx, &rp)
	if err != nil {
		return rp, err
	}
	subs := make([]report, n)
	keys := make([]*protocol.Keys, n)
	seen := map[string]bool{}
	for i := range n {
		subs[i] = report{SKU: bucketName(sku, i), StoreRemaining: rp.StoreRemaining}
		keys[i] = rc.r.item(subs[i].SKU)
		if !unknown {
			if err := rc.ledgerPassIn(ctx, keys[i], &subs[i], seen, false); err != nil {
				return rp, err
			}
		}
	}
	if lister, ok := rc.store.(RecordLister); ok && !unknown {
		cutoff := rc.r.opts.now().Add(-rc.retention).UnixMilli()
		if err := rc.rerecord(ctx, nil, &rp, lister, seen, cutoff, n); err != nil {
			return rp, err
		}
	}
	all := itemSnapshot{entries: map[string]Entry{}}
	snaps := make([]itemSnapshot, n)
	for i := range n {
		if snaps[i], err = rc.snapshot(ctx, keys[i], &subs[i]); err != nil {
			return rp, err
		}
		s := &subs[i]
		rp.Missing = rp.Missing || s.Missing
		rp.Available += s.Available - snaps[i].transferred
		rp.Held += s.Held
		rp.Pending += s.Pending
		rp.Published += s.Published
		rp.DeadLetters += s.DeadLetters
		rp.Orphaned += s.Orphaned
		if s.NeedsHuman != "" {
			rp.NeedsHuman = fmt.Sprintf("bucket %d: %s", i, s.NeedsHuman)
		}
		for _, id := range snaps[i].ids {
			all.entries[id] = snaps[i].entries[id]
			all.ids = append(all.ids, id)
		}
	}
	defer func() {
		for _, s := range subs {
			rp.Requeued += s.Requeued
			rp.Rerecorded += s.Rerecorded
			rp.Resynced += s.Resynced
			rp.Settled += s.Settled
			rp.Trimmed += s.Trimmed
			rp.Unregistered = rp.Unregistered || s.Unregistered
		}
	}()
	if rp.NeedsHuman != "" {
		return rp, nil
	}
	if unknown {
		all.unknownToStore(&rp)
		return rp, nil
	}
	expected, recs, err := rc.compareOnly(ctx, &rp, all)
	if err != nil || rp.Busy {
		return rp, err
	}
	if rp.Missing {
		// Only a bucket can be missing: the others hold the rest of the item's stock.
		rp.Drift = rp.Available + rp.Held - expected
	}
	for i := range n {
		if len(snaps[i].published) > 0 && !rc.dry {
			if err := rc.settle(ctx, &subs[i], snaps[i].published, snaps[i].entries, recs); err != nil {
				return rp, err
			}
		}
	}
	switch {
	case rp.Orphaned > 0:
		rp.NeedsHuman = fmt.Sprintf("%d undelivered events have lost their ledger entries (see the dead-letter set): "+
			"the units they took are counted nowhere else, so the item is not repaired until an operator settles them", rp.Orphaned)
	case rp.Missing:
		rp.NeedsHuman = "a bucket of the item lost its hash: not rebuilt (the other buckets hold the rest of its stock)"
	case rp.Drift == 0 && rc.restocked == 0 && rc.sold == 0:
	case rc.limit > 0 && abs(rp.Drift) > rc.limit:
		rp.NeedsHuman = fmt.Sprintf("drift %d above the repair limit %d", rp.Drift, rc.limit)
	case rc.dry:
	default:
		// What Redis lacks goes to bucket 0; what it has too much is taken from the buckets in
		// turn, each down to nothing at most.
		left := -rp.Drift
		for i := 0; i < n && (i == 0 || left != 0); i++ { // bucket 0 counts what the pass wrote back, even with no drift
			o, err := decodeOne(protocol.Adjust.Exec(ctx, rc.r.client, keys[i].ForAdjust(), rc.adjustArgs(left)))
			rc.r.noteEvents(subs[i].SKU)
			if err == nil && o.code == protocol.Invalid {
				err = fmt.Errorf("%w: adjust by %d", ErrInvalid, left)
			}
			if err != nil {
				return rp, fmt.Errorf("stock: reconcile %s: adjust bucket %d: %w", sku, i, err)
			}
			if o.code == protocol.NotLoaded {
				rp.NeedsHuman = "a bucket's keys vanished during the pass"
				return rp, nil
			}
			rp.Adjusted += o.remaining
			left -= o.remaining
		}
		if left != 0 {
			rp.NeedsHuman = fmt.Sprintf("Redis had sold %d units more than the store has", -left)
		}
	}
	for i := range n {
		if err := rc.conclude(ctx, keys[i], &subs[i], 0); err != nil {
			return rp, err
		}
		if subs[i].DeadLetters > 0 && rp.NeedsHuman == "" {
			rp.NeedsHuman = fmt.Sprintf("bucket %d: %s", i, subs[i].NeedsHuman)
		}
	}
	return rp, rc.concludeBucketed(ctx, sku, n, &rp, life)
}

// transferGrace is how long a transfer may be in flight before the sweeper completes it: far
// more than a transfer takes, so that it completes only the transfers of a process that died.
const transferGrace = 5 * time.Second

// splitBucket returns the item and the index of bucket name, or name and -1 for an item that
// is not a bucket.
func splitBucket(name string) (string, int) {
	i := strings.LastIndexByte(name, '|')
	if i < 0 {
		return name, -1
	}
	b, err := strconv.Atoi(name[i+1:])
	if err != nil {
		return name, -1
	}
	return name[:i], b
}

// transferHeads returns, for each bucket among names (of an item this Reserver splits) with a
// transfer in flight, when its oldest one is due for recovery (ms, Redis's clock): transferGrace
// after it began.
func (r *Reserver) transferHeads(ctx context.Context, names []string) (map[string]int64, error) {
	var buckets []string
	var cmds rueidis.Commands
	for _, name := range names {
		parent, i := splitBucket(name)
		if i < 0 || i >= r.bucketsOf(parent) {
			continue
		}
		buckets = append(buckets, name)
		cmds = append(cmds, r.client.B().Zrange().Key(r.item(name).InFlight).Min("0").Max("0").Withscores().Build())
	}
	out := map[string]int64{}
	if len(cmds) == 0 {
		return out, nil
	}
	for i, res := range r.client.DoMulti(ctx, cmds...) {
		zs, err := res.AsZScores()
		if err != nil {
			return nil, fmt.Errorf("stock: sweep: transfers in flight of %s: %w", buckets[i], err)
		}
		if len(zs) > 0 {
			out[buckets[i]] = int64(zs[0].Score) + transferGrace.Milliseconds()
		}
	}
	return out, nil
}

// splitInRedis reports whether the registry has item sku's first bucket: the item is split over
// buckets in Redis (an error answers yes: the caller then repairs nothing).
func (rc *Reconciler) splitInRedis(ctx context.Context, sku string) bool {
	yes, err := rc.r.client.Do(ctx, rc.r.client.B().Sismember().Key(rc.r.registryKey()).Member(bucketName(sku, 0)).Build()).AsBool()
	return yes || err != nil
}

// names returns the names of the items that hold sku's keys: sku, or its buckets.
func (r *Reserver) names(sku string) []string {
	n := r.bucketsOf(sku)
	if n == 0 {
		return []string{sku}
	}
	out := make([]string, n)
	for i := range out {
		out[i] = bucketName(sku, i)
	}
	return out
}
