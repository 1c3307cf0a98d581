package stock

// Buckets: the building blocks of an item whose stock is split over several cluster slots, so
// that one hot item is served by several Redis cores. Not wired into the Reserver's methods yet:
// the routing of requests, Levels, the relay, the reconciler and the fast path do not know
// bucketed items. What is here is the part every one of them will stand on:
//
//   - A bucket is a hidden item: bucket i of item X is the item named bucketName(X, i),
//     "X|i". Names cannot contain '|', so no item of a user ever meets a bucket, and each
//     bucket's keys carry a hash tag of their own ({X|i}): another slot.
//   - An id lives in one bucket. route claims a bucket for an id in the claims hash of the id's
//     home bucket (homeBucket), and answers the claimed bucket to every later request of the
//     id, whoever sends it.
//   - A transfer moves stock from one bucket (the donor) to another (the target) exactly once
//     and crash-safely: xout.lua takes the units from the donor and records the transfer there
//     as in flight, xin.lua adds them to the target once per transfer id, xdone.lua ends it in
//     the donor. A transfer cut by a crash after xout is always completed, never undone
//     (recoverTransfers): adding stock to the target cannot fail for lack of anything. Each
//     bucket keeps t, its net units transferred in, so that available + held + sold - t is
//     its loaded count, and the sum over the buckets of available - t is the item's available
//     stock whatever transfers are in flight, at whatever moments the buckets are read.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
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
// of the id claimed, or want, which this call then claims.
func (r *Reserver) route(ctx context.Context, sku, id string, n, want int) (int, error) {
	home := r.item(bucketName(sku, homeBucket(id, n)))
	s, err := protocol.Route.Exec(ctx, r.client, home.ForRoute(), []string{id, strconv.Itoa(want)}).ToString()
	if err != nil {
		return 0, fmt.Errorf("stock: route %s/%s: %w", sku, id, err)
	}
	b, err := strconv.Atoi(s)
	if err != nil || b < 0 || b >= n {
		return 0, fmt.Errorf("%w: route %s/%s: the claims hash names bucket %q of %d", ErrInvalid, sku, id, s, n)
	}
	return b, nil
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
	o, err := decodeOne(res)
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
	k := o.remaining // xout answers the units taken in the second slot
	if err := r.transferIn(ctx, sku, tid, from, to, k); err != nil {
		return 0, err
	}
	return k, nil
}

// transferIn completes transfer tid of k units from bucket from to bucket to: the target adds
// them (once), then the donor ends the transfer.
func (r *Reserver) transferIn(ctx context.Context, sku, tid string, from, to int, k int64) error {
	donor, target := r.item(bucketName(sku, from)), r.item(bucketName(sku, to))
	res, _ := r.exec(ctx, protocol.XIn, target.ForXIn(), []string{tid, strconv.Itoa(from), strconv.FormatInt(k, 10)})
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
		if err := r.transferIn(ctx, sku, tid, from, x2.Other, x2.Units); err != nil {
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
