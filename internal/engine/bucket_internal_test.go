package engine

import (
	"context"
	"errors"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock/internal/protocol"
	"github.com/stockres/stock/internal/redistest"
)

// transferred is how many units r.transfer moved, failing the test on an error.
func transferred(t *testing.T, r *Reserver, sku, tid string, from, to int, want, least int64) int64 {
	t.Helper()
	k, err := r.transfer(context.Background(), sku, tid, from, to, want, least)
	require.NoError(t, err)
	return k
}

// loadBuckets loads bucket i of sku with qty[i] units.
func loadBuckets(t *testing.T, r *Reserver, sku string, qty ...int64) {
	t.Helper()
	for i, q := range qty {
		code, _, err := decodePair(protocol.Load.Exec(context.Background(), r.client, r.item(bucketName(sku, i)).ForLoad(), []string{strconv.FormatInt(q, 10)}))
		require.NoError(t, err)
		require.Equal(t, protocol.OK, code)
	}
}

// bucketState reads available and t of every bucket, and checks loaded = a + h + s - t.
func bucketState(t *testing.T, r *Reserver, sku string, n int) (avail, moved []int64) {
	t.Helper()
	for i := range n {
		vs, err := r.client.Do(context.Background(), r.client.B().Hmget().Key(r.item(bucketName(sku, i)).Item).Field("a", "h", "s", "l", "t").Build()).ToArray()
		require.NoError(t, err)
		var f [5]int64
		for j, v := range vs {
			if !v.IsNil() {
				f[j], err = v.AsInt64()
				require.NoError(t, err)
			}
		}
		require.Equal(t, f[3], f[0]+f[1]+f[2]-f[4], "bucket %d: loaded = available + held + sold - transferred in: %v", i, f)
		avail, moved = append(avail, f[0]), append(moved, f[4])
	}
	return avail, moved
}

func inFlight(t *testing.T, r *Reserver, sku string, i int) int64 {
	t.Helper()
	n, err := r.client.Do(context.Background(), r.client.B().Zcard().Key(r.item(bucketName(sku, i)).InFlight).Build()).AsInt64()
	require.NoError(t, err)
	return n
}

func TestBucketTransfer(t *testing.T) {
	eachReserver(t, func(t *testing.T, r *Reserver) {
		ctx := context.Background()
		loadBuckets(t, r, "x:~1", 10, 0)
		assert.Equal(t, int64(4), transferred(t, r, "x:~1", "t1", 0, 1, 4, 1))
		a, m := bucketState(t, r, "x:~1", 2)
		assert.Equal(t, []int64{6, 4}, a)
		assert.Equal(t, []int64{-4, 4}, m)
		assert.Zero(t, inFlight(t, r, "x:~1", 0))

		// The same transfer id again: a replay, nothing moves twice.
		assert.Equal(t, int64(4), transferred(t, r, "x:~1", "t1", 0, 1, 4, 1))
		a, _ = bucketState(t, r, "x:~1", 2)
		assert.Equal(t, []int64{6, 4}, a)

		// Everything back, and more asked than there is: the donor gives what it has.
		assert.Equal(t, int64(4), transferred(t, r, "x:~1", "t2", 1, 0, 100, 1))
		a, m = bucketState(t, r, "x:~1", 2)
		assert.Equal(t, []int64{10, 0}, a)
		assert.Equal(t, []int64{0, 0}, m)

		// Too little for the least worth moving: nothing is written.
		assert.Zero(t, transferred(t, r, "x:~1", "t3", 1, 0, 5, 1))
		assert.Zero(t, transferred(t, r, "x:~1", "t4", 0, 1, 20, 11))
		for i := range 2 {
			n, err := r.client.Do(ctx, r.client.B().Hlen().Key(r.item(bucketName("x:~1", i)).Transfers).Build()).AsInt64()
			require.NoError(t, err)
			assert.Equal(t, int64(2), n, "bucket %d: two transfers recorded, none for the refused ones", i)
		}

		// A transfer id is one transfer: the same id between other buckets is a conflict.
		_, err := r.transfer(ctx, "x:~1", "t1", 1, 0, 1, 1)
		assert.ErrorIs(t, err, ErrConflict)
		_, err = r.transfer(ctx, "x:~1", "t9", 0, 0, 1, 1)
		assert.ErrorIs(t, err, ErrInvalid)
		_, err = r.transfer(ctx, "nothing", "t9", 0, 1, 1, 1)
		assert.ErrorIs(t, err, ErrNotLoaded)
	})
}

// TestBucketTransferCutRecovered: a process dies after the donor gave its units: the transfer
// stays in flight, and recoverTransfers completes it, once.
func TestBucketTransferCutRecovered(t *testing.T) {
	eachReserver(t, func(t *testing.T, r *Reserver) {
		ctx := context.Background()
		loadBuckets(t, r, "cut", 5, 5, 5)
		o, err := decodeXOut(protocol.XOut.Exec(ctx, r.client, r.item(bucketName("cut", 2)).ForXOut(), []string{"tc", "0", "3", "1"}))
		require.NoError(t, err)
		require.Equal(t, protocol.OK, o.code)
		a, m := bucketState(t, r, "cut", 3)
		assert.Equal(t, []int64{5, 5, 2}, a, "the units are in flight")
		assert.Equal(t, int64(-3), m[2])
		assert.Equal(t, int64(1), inFlight(t, r, "cut", 2))

		n, err := r.recoverTransfers(ctx, "cut", 2, 3, 0)
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		a, m = bucketState(t, r, "cut", 3)
		assert.Equal(t, []int64{8, 5, 2}, a)
		assert.Equal(t, []int64{3, 0, -3}, m)
		assert.Zero(t, inFlight(t, r, "cut", 2))

		// Again, and the original process coming back to finish: nothing moves twice.
		n, err = r.recoverTransfers(ctx, "cut", 2, 3, 0)
		require.NoError(t, err)
		assert.Zero(t, n)
		require.NoError(t, r.transferIn(ctx, "cut", "tc", 2, 0, 3, o.seq))
		a, _ = bucketState(t, r, "cut", 3)
		assert.Equal(t, []int64{8, 5, 2}, a)
	})
}

// TestBucketTransferConcurrent: many transfers out of one donor at once never take more than it
// has, and every unit arrives once.
func TestBucketTransferConcurrent(t *testing.T) {
	eachReserver(t, func(t *testing.T, r *Reserver) {
		ctx := context.Background()
		loadBuckets(t, r, "hot", 20, 0, 0)
		var moved atomic.Int64
		var wg sync.WaitGroup
		for g := range 16 {
			wg.Go(func() {
				for j := range 3 {
					k, err := r.transfer(ctx, "hot", newTransferID(), 0, 1+(g+j)%2, 3, 1)
					assert.NoError(t, err)
					moved.Add(k)
				}
			})
		}
		wg.Wait()
		assert.Equal(t, int64(20), moved.Load())
		a, m := bucketState(t, r, "hot", 3)
		assert.Equal(t, int64(0), a[0])
		assert.Equal(t, int64(20), a[1]+a[2])
		var sum int64
		for i := range a {
			sum += a[i] - m[i]
		}
		assert.Equal(t, int64(20), sum, "the sum of available - transferred in is the item's stock")
	})
}

// TestBucketTransferCorruptChangesNothing: a corrupt transfer entry or counter is an error
// before any write.
func TestBucketTransferCorruptChangesNothing(t *testing.T) {
	eachReserver(t, func(t *testing.T, r *Reserver) {
		ctx := context.Background()
		loadBuckets(t, r, "bad", 5, 5)
		donor := r.item(bucketName("bad", 0))
		require.NoError(t, r.client.Do(ctx, r.client.B().Hset().Key(donor.Transfers).FieldValue().FieldValue("tb", "O|x|2|1").Build()).Error())
		_, err := r.transfer(ctx, "bad", "tb", 0, 1, 2, 1)
		require.Error(t, err)
		require.NoError(t, r.client.Do(ctx, r.client.B().Hset().Key(donor.Item).FieldValue().FieldValue("t", "zz").Build()).Error())
		_, err = r.transfer(ctx, "bad", "tz", 0, 1, 2, 1)
		require.Error(t, err)
		a, err := r.client.Do(ctx, r.client.B().Hmget().Key(donor.Item).Field("a").Build()).ToArray()
		require.NoError(t, err)
		v, _ := a[0].AsInt64()
		assert.Equal(t, int64(5), v, "nothing was taken")
		assert.Zero(t, inFlight(t, r, "bad", 0))
	})
}

// TestBucketRoute: the first request of an id claims its bucket; every later one, from whatever
// bucket it would have gone to, gets that one.
func TestBucketRoute(t *testing.T) {
	eachReserver(t, func(t *testing.T, r *Reserver) {
		ctx := context.Background()
		for _, step := range []struct {
			id             string
			want           int  // the bucket asked for
			giveBack       bool // the request gives back
			b              int  // the bucket routed to
			byGiveBack     bool // the id was claimed by a give-back
			bMsg, claimMsg string
		}{
			{"o:1", 2, false, 2, false, "", ""},
			{"o:1", 3, true, 2, false, "the id's bucket, not the one asked for", "claimed by a take"},
			{"o:2", 3, true, 3, true, "", "claimed by a give-back"},
			{"o:2", 1, false, 3, true, "", ""},
		} {
			b, gb, err := r.route(ctx, "r", step.id, 4, step.want, step.giveBack)
			require.NoError(t, err)
			assert.Equal(t, step.b, b, step.bMsg)
			assert.Equal(t, step.byGiveBack, gb, step.claimMsg)
		}
		home := r.item(bucketName("r", homeBucket("o:1", 4)))
		require.NoError(t, r.client.Do(ctx, r.client.B().Hset().Key(home.Claims).FieldValue().FieldValue("o:1", "9").Build()).Error())
		_, _, err := r.route(ctx, "r", "o:1", 4, 1, false)
		assert.ErrorIs(t, err, ErrInvalid, "a claim out of range is refused")
	})
}

func TestBucketOf(t *testing.T) {
	counts := make([]int, 3)
	for i := range 30000 {
		counts[bucketOf("user-"+strconv.Itoa(i), 3)]++
	}
	for b, c := range counts {
		assert.InDelta(t, 10000, c, 500, "bucket %d of 3 gets about a third of the keys", b)
	}
	assert.Equal(t, bucketOf("alice", 7), bucketOf("alice", 7))
	assert.Equal(t, "x|3", bucketName("x", 3))
	assert.Error(t, checkName("sku", bucketName("x", 3)), "no name of a user is a bucket's")
}

// bucketedReserver returns a Reserver on c whose every item is split over n buckets.
func bucketedReserver(t *testing.T, c rueidis.Client, n int, opts ...Option) *Reserver {
	t.Helper()
	r, err := New(c, opts...)
	require.NoError(t, err)
	r.opts.buckets = func(string) int { return n }
	return r
}

func bucketLevels(t *testing.T, r *Reserver, sku string) Levels {
	t.Helper()
	l, err := r.Levels(context.Background(), sku)
	require.NoError(t, err)
	require.Equal(t, l.Loaded, l.Available+l.Held+l.Sold, "loaded = available + held + sold: %+v", l)
	return l
}

// TestBucketedSellsEveryUnit: many buyers over an item split in three: exactly its stock is sold,
// whichever buckets the buyers land in (no unit stranded in a bucket), with coalescing on and off.
func TestBucketedSellsEveryUnit(t *testing.T) {
	eachClient(t, func(t *testing.T, c rueidis.Client) {
		for _, inflight := range []int{0, 4} {
			r := bucketedReserver(t, c, 3, WithCoalescing(inflight), WithPrefix("c"+strconv.Itoa(inflight)))
			ctx := context.Background()
			require.NoError(t, r.Load(ctx, "hot:~1", 31))
			assert.ErrorIs(t, r.Load(ctx, "hot:~1", 31), ErrLoaded)
			assert.Equal(t, Levels{Available: 31, Loaded: 31}, bucketLevels(t, r, "hot:~1"))
			var ok, soldOut atomic.Int64
			var wg sync.WaitGroup
			for g := range 16 {
				wg.Go(func() {
					for j := range 5 {
						id := "o" + strconv.Itoa(g*10+j)
						_, err := r.Deduct(ctx, Request{SKU: "hot:~1", ID: id, User: "u" + id, Qty: 1})
						switch {
						case err == nil:
							ok.Add(1)
						case errors.Is(err, ErrSoldOut) || errors.Is(err, ErrInsufficient):
							soldOut.Add(1)
						default:
							t.Error(err)
						}
					}
				})
			}
			wg.Wait()
			assert.Equal(t, int64(31), ok.Load())
			assert.Equal(t, int64(80-31), soldOut.Load())
			assert.Equal(t, Levels{Sold: 31, Loaded: 31}, bucketLevels(t, r, "hot:~1"))
			entries := 0
			for i := range 3 {
				n, err := r.client.Do(ctx, r.client.B().Hlen().Key(r.item(bucketName("hot:~1", i)).Ledger).Build()).AsInt64()
				require.NoError(t, err)
				entries += int(n)
			}
			assert.Equal(t, 31, entries, "one ledger entry per sale, in the buckets")

			// Every buyer in one bucket: the others' stock comes to them.
			require.NoError(t, r.Load(ctx, "skew", 12))
			sold := 0
			for i := 0; sold < 12; i++ {
				u := "v" + strconv.Itoa(i)
				if bucketOf(u, 3) != 0 {
					continue
				}
				_, err := r.Deduct(ctx, Request{SKU: "skew", ID: u, User: u, Qty: 1})
				require.NoError(t, err, "unit %d of 12", sold+1)
				sold++
			}
			assert.Equal(t, Levels{Sold: 12, Loaded: 12}, bucketLevels(t, r, "skew"))
		}
	})
}

// TestBucketedGathersScatteredUnits: the last units of an item, one per bucket, serve a request
// for all of them.
func TestBucketedGathersScatteredUnits(t *testing.T) {
	eachClient(t, func(t *testing.T, c rueidis.Client) {
		r := bucketedReserver(t, c, 3)
		ctx := context.Background()
		require.NoError(t, r.Load(ctx, "g", 3))
		rc, err := r.Deduct(ctx, Request{SKU: "g", ID: "all", User: "ann", Qty: 3})
		require.NoError(t, err)
		assert.Equal(t, int64(3), rc.Qty)
		_, err = r.Deduct(ctx, Request{SKU: "g", ID: "more", User: "bob", Qty: 1})
		assert.ErrorIs(t, err, ErrSoldOut)
		rc, err = r.Deduct(ctx, Request{SKU: "g", ID: "all", User: "ann", Qty: 3})
		require.NoError(t, err)
		assert.True(t, rc.Replayed)
		assert.Equal(t, Levels{Sold: 3, Loaded: 3}, bucketLevels(t, r, "g"))
	})
}

// TestBucketedContract: the answers of a plain item, on an item split over buckets.
func TestBucketedContract(t *testing.T) {
	eachClient(t, func(t *testing.T, c rueidis.Client) {
		r := bucketedReserver(t, c, 4, WithUserLimit(2))
		ctx := context.Background()
		require.NoError(t, r.Load(ctx, "s", 20))

		// The per-user limit holds over the whole item: a buyer's units live in one bucket.
		var taken int
		for i := range 5 {
			_, err := r.Deduct(ctx, Request{SKU: "s", ID: "lim" + strconv.Itoa(i), User: "greedy", Qty: 1})
			if err == nil {
				taken++
			} else {
				assert.ErrorIs(t, err, ErrUserLimit)
			}
		}
		assert.Equal(t, 2, taken)

		// Replays, and an id reused by another buyer: a conflict, never a second take.
		_, err := r.Deduct(ctx, Request{SKU: "s", ID: "o1", User: "ann", Qty: 1})
		require.NoError(t, err)
		rc, err := r.Deduct(ctx, Request{SKU: "s", ID: "o1", User: "ann", Qty: 1})
		require.NoError(t, err)
		assert.True(t, rc.Replayed)
		for _, u := range []string{"bob", "carl", "dora", "eve", ""} {
			_, err = r.Deduct(ctx, Request{SKU: "s", ID: "o1", User: u, Qty: 1})
			assert.ErrorIs(t, err, ErrConflict, "o1 reused by %q", u)
		}
		e, err := r.Ledger(ctx, "s", "o1")
		require.NoError(t, err)
		assert.Equal(t, "ann", e.User)
		assert.Equal(t, Levels{Available: 17, Sold: 3, Loaded: 20}, bucketLevels(t, r, "s"))

		// An id claimed by a buyer whose request was refused (nothing in the ledger) is still
		// that buyer's: another buyer's request with it is a conflict, not a take in the first
		// buyer's bucket (where the second buyer's limit is not kept).
		other := "y0"
		for i := 1; bucketOf(other, 4) == bucketOf("x0", 4); i++ {
			other = "y" + strconv.Itoa(i)
		}
		require.NoError(t, r.Load(ctx, "w", 0))
		_, err = r.Deduct(ctx, Request{SKU: "w", ID: "w1", User: "x0", Qty: 1})
		assert.ErrorIs(t, err, ErrSoldOut)
		_, err = r.Restock(ctx, "w", "rw", 4)
		require.NoError(t, err)
		_, err = r.Deduct(ctx, Request{SKU: "w", ID: "w1", User: other, Qty: 1})
		assert.ErrorIs(t, err, ErrConflict)
		assert.Equal(t, Levels{Available: 4, Loaded: 4}, bucketLevels(t, r, "w"))

		// Restore gives back once; a restore that overtakes its deduct refuses the late deduct.
		rc, err = r.Restore(ctx, "s", "o1")
		require.NoError(t, err)
		assert.Equal(t, int64(1), rc.Qty)
		rc, err = r.Restore(ctx, "s", "o1")
		require.NoError(t, err)
		assert.True(t, rc.Replayed)
		_, err = r.Restore(ctx, "s", "early")
		assert.ErrorIs(t, err, ErrUnknownID)
		for _, u := range []string{"ann", "bob", ""} {
			_, err = r.Deduct(ctx, Request{SKU: "s", ID: "early", User: u, Qty: 1})
			assert.ErrorIs(t, err, ErrRestored, "the late deduct of %q", u)
		}

		// Holds: confirm, cancel, extend find the hold's bucket.
		_, err = r.Hold(ctx, Request{SKU: "s", ID: "h1", User: "fay", Qty: 2}, time.Minute)
		require.NoError(t, err)
		_, err = r.Hold(ctx, Request{SKU: "s", ID: "h2", User: "gus", Qty: 1}, time.Minute)
		require.NoError(t, err)
		_, err = r.Extend(ctx, "s", "h1", 2*time.Minute)
		require.NoError(t, err)
		_, err = r.Confirm(ctx, "s", "h1")
		require.NoError(t, err)
		_, err = r.Cancel(ctx, "s", "h2")
		require.NoError(t, err)
		_, err = r.Confirm(ctx, "s", "h2")
		assert.ErrorIs(t, err, ErrRestored)
		_, err = r.Confirm(ctx, "s", "nohold")
		assert.ErrorIs(t, err, ErrUnknownID)
		assert.Equal(t, Levels{Available: 16, Sold: 4, Loaded: 20}, bucketLevels(t, r, "s"))

		// Restock, close and reopen reach every bucket.
		rc, err = r.Restock(ctx, "s", "po1", 10)
		require.NoError(t, err)
		assert.Equal(t, int64(10), rc.Qty)
		require.NoError(t, r.CloseItem(ctx, "s"))
		assert.True(t, bucketLevels(t, r, "s").Closed)
		_, err = r.Deduct(ctx, Request{SKU: "s", ID: "shut", User: "hal", Qty: 1})
		assert.ErrorIs(t, err, ErrClosed)
		require.NoError(t, r.ReopenItem(ctx, "s"))
		assert.Equal(t, Levels{Available: 26, Sold: 4, Loaded: 30}, bucketLevels(t, r, "s"))
	})
}

// TestBucketedRetryRecordsRefusal: a retry refused for lack of stock in the whole item records
// its refusal in the id's bucket, so that the first attempt, arriving later, is refused too.
func TestBucketedRetryRecordsRefusal(t *testing.T) {
	eachClient(t, func(t *testing.T, c rueidis.Client) {
		r := bucketedReserver(t, c, 2)
		ctx := context.Background()
		require.NoError(t, r.Load(ctx, "z", 1))
		_, err := r.Deduct(ctx, Request{SKU: "z", ID: "first", User: "a", Qty: 1})
		require.NoError(t, err)
		_, err = r.Deduct(ctx, Request{SKU: "z", ID: "late", User: "b", Qty: 1, Retry: true})
		assert.ErrorIs(t, err, ErrSoldOut)
		_, err = r.Restock(ctx, "z", "r1", 5)
		require.NoError(t, err)
		_, err = r.Deduct(ctx, Request{SKU: "z", ID: "late", User: "b", Qty: 1})
		assert.ErrorIs(t, err, ErrSoldOut, "the first attempt of a refused retry is refused too")
		// A request refused without Retry records nothing: it may be taken later.
		require.NoError(t, r.Load(ctx, "y", 0))
		_, err = r.Deduct(ctx, Request{SKU: "y", ID: "p", User: "a", Qty: 1})
		assert.ErrorIs(t, err, ErrSoldOut)
		_, err = r.Restock(ctx, "y", "r1", 1)
		require.NoError(t, err)
		_, err = r.Deduct(ctx, Request{SKU: "y", ID: "p", User: "a", Qty: 1})
		assert.NoError(t, err)
	})
}

// TestBucketedSweeperCompletesCutTransfer: a transfer whose process died after its first half
// is completed by the sweeper once it is older than transferGrace, and not before.
func TestBucketedSweeperCompletesCutTransfer(t *testing.T) {
	eachClient(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := bucketedReserver(t, c, 2)
		require.NoError(t, r.Load(ctx, "sw", 10))
		donor := r.item(bucketName("sw", 0))
		o, err := decodeXOut(protocol.XOut.Exec(ctx, r.client, donor.ForXOut(), []string{"cut", "1", "3", "1"}))
		require.NoError(t, err)
		require.Equal(t, protocol.OK, o.code)
		r.noteHold(bucketName("sw", 0))
		r.hints.Flush()
		var walk registryWalk
		_, err = r.sweepDue(ctx, &walk)
		require.NoError(t, err)
		assert.Equal(t, int64(1), inFlight(t, r, "sw", 0), "a young transfer is left to its process")
		l := bucketLevels(t, r, "sw")
		assert.Equal(t, int64(10), l.Available, "units in flight count as available")

		// Make it old, as if its process died transferGrace ago.
		old := float64(time.Now().Add(-2 * transferGrace).UnixMilli())
		require.NoError(t, r.client.Do(ctx, r.client.B().Zadd().Key(donor.InFlight).Xx().ScoreMember().ScoreMember(old, "cut").Build()).Error())
		require.NoError(t, r.writeHints(ctx, nil, map[string]int64{bucketName("sw", 0): 0}, 0))
		_, err = r.sweepDue(ctx, &walk)
		require.NoError(t, err)
		assert.Zero(t, inFlight(t, r, "sw", 0))
		a, m := bucketState(t, r, "sw", 2)
		assert.Equal(t, []int64{2, 8}, a)
		assert.Equal(t, []int64{-3, 3}, m)
		assert.Equal(t, Levels{Available: 10, Loaded: 10}, bucketLevels(t, r, "sw"))
	})
}

// TestBucketedDueHoldsInOtherBuckets: the stock of holds past their deadline in another bucket
// serves a request, as a plain item's due holds do (no phantom sold-out).
func TestBucketedDueHoldsInOtherBuckets(t *testing.T) {
	eachClient(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := bucketedReserver(t, c, 2)
		require.NoError(t, r.Load(ctx, "dh", 2))
		a, b := "a0", "b0"
		for i := 1; bucketOf(b, 2) == bucketOf(a, 2); i++ {
			b = "b" + strconv.Itoa(i)
		}
		_, err := r.Hold(ctx, Request{SKU: "dh", ID: "h", User: a, Qty: 2}, 5*time.Millisecond)
		require.NoError(t, err)
		redistest.Sleep(c, 50*time.Millisecond) // past the deadline; no sweep runs
		rc, err := r.Deduct(ctx, Request{SKU: "dh", ID: "d", User: b, Qty: 2})
		require.NoError(t, err, "the due hold's units serve the request")
		assert.Equal(t, int64(2), rc.Qty)
		assert.Equal(t, Levels{Sold: 2, Loaded: 2}, bucketLevels(t, r, "dh"))
		_, err = r.Confirm(ctx, "dh", "h")
		assert.ErrorIs(t, err, ErrExpired)
	})
}

// TestBucketedLoadRefusesTheOtherForm: an item Redis has split is loaded for a Reserver that
// does not split it, and an item Redis has plain is loaded for one that splits it: neither
// makes a second stock beside the first.
func TestBucketedLoadRefusesTheOtherForm(t *testing.T) {
	eachClient(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		split := bucketedReserver(t, c, 3)
		plain, err := New(c)
		require.NoError(t, err)
		require.NoError(t, split.Load(ctx, "s", 10))
		assert.ErrorIs(t, plain.Load(ctx, "s", 10), ErrLoaded)
		require.NoError(t, plain.Load(ctx, "p", 10))
		assert.ErrorIs(t, split.Load(ctx, "p", 10), ErrLoaded)
		_, err = plain.Levels(ctx, "s")
		assert.ErrorIs(t, err, ErrNotLoaded)
		_, err = split.Levels(ctx, "p")
		assert.ErrorIs(t, err, ErrNotLoaded)
	})
}

// idHomeIn returns an id of the form prefix+N whose home bucket (of n) is b.
func idHomeIn(prefix string, b, n int) string {
	for i := 0; ; i++ {
		id := prefix + strconv.Itoa(i)
		if homeBucket(id, n) == b {
			return id
		}
	}
}

// TestBucketedRestockKeepsItemUnderMaxQty: an item split over buckets holds at most MaxQty units
// in all, as a plain item does. Load splits up to MaxQty over the buckets; a restock that would
// take the sum of the buckets' loaded counts (what Levels reports) past MaxQty is refused with
// ErrInvalid, whichever bucket its id goes to, and writes nothing: no ledger entry, no event,
// no counter changed. A restock that brings the item to MaxQty exactly is accepted, and its
// repeat is a replay even once the item is full.
func TestBucketedRestockKeepsItemUnderMaxQty(t *testing.T) {
	eachClient(t, func(t *testing.T, c rueidis.Client) {
		const n = 3
		ctx := context.Background()
		r := bucketedReserver(t, c, n)

		// Load near and at MaxQty: the buckets' shares sum to what was loaded.
		require.NoError(t, r.Load(ctx, "full", MaxQty))
		assert.Equal(t, Levels{Available: MaxQty, Loaded: MaxQty}, bucketLevels(t, r, "full"))
		assert.ErrorIs(t, r.Load(ctx, "over", MaxQty+1), ErrInvalid)
		require.NoError(t, r.Load(ctx, "near", MaxQty-10))
		near := Levels{Available: MaxQty - 10, Loaded: MaxQty - 10}
		assert.Equal(t, near, bucketLevels(t, r, "near"))
		pending, _, err := r.pendingCounts(ctx, "near")
		require.NoError(t, err)

		// Each bucket has room for 11 more of its own; the item has room for 10.
		for b := range n {
			id := idHomeIn("po-", b, n)
			_, err := r.Restock(ctx, "near", id, 11)
			require.ErrorIs(t, err, ErrInvalid, "a restock of 11 in bucket %d passes MaxQty in all", b)
			assert.ErrorContains(t, err, "MaxQty")
			_, err = r.Ledger(ctx, "near", id)
			assert.ErrorIs(t, err, ErrUnknownID, "the refused restock %s left no entry", id)
			_, err = r.Restock(ctx, "full", id, 1)
			assert.ErrorIs(t, err, ErrInvalid, "a full item takes no unit more, in bucket %d", b)
		}
		assert.Equal(t, near, bucketLevels(t, r, "near"), "the refusals changed no counter")
		p, _, err := r.pendingCounts(ctx, "near")
		require.NoError(t, err)
		assert.Equal(t, pending, p, "the refusals queued no event")
		assert.Equal(t, Levels{Available: MaxQty, Loaded: MaxQty}, bucketLevels(t, r, "full"))

		// Up to MaxQty exactly, in two buckets; then nothing more, and a repeat is a replay.
		first, second := idHomeIn("ok-", 0, n), idHomeIn("ok-", 2, n)
		_, err = r.Restock(ctx, "near", first, 4)
		require.NoError(t, err)
		_, err = r.Restock(ctx, "near", second, 6)
		require.NoError(t, err)
		assert.Equal(t, Levels{Available: MaxQty, Loaded: MaxQty}, bucketLevels(t, r, "near"))
		for b := range n {
			_, err = r.Restock(ctx, "near", idHomeIn("more-", b, n), 1)
			assert.ErrorIs(t, err, ErrInvalid, "bucket %d", b)
		}
		rc, err := r.Restock(ctx, "near", first, 4)
		require.NoError(t, err)
		assert.True(t, rc.Replayed, "a repeat of an accepted restock is a replay at MaxQty too")
		assert.Equal(t, Levels{Available: MaxQty, Loaded: MaxQty}, bucketLevels(t, r, "near"))
	})
}

// TestBucketKeysSpreadOverSlots: bucket i of an item of n buckets keeps every key in the i-th of
// n equal slot ranges, as Redis itself computes the slot (CLUSTER KEYSLOT), so that on a cluster
// of n masters owning equal ranges each bucket has a master of its own; the keys a Load and a
// deduct write are those keys; the bucket's name is unchanged.
func TestBucketKeysSpreadOverSlots(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		if b.Name != "cluster" {
			continue
		}
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c := b.Client(t)
			for _, n := range []int{2, 3, 5} {
				r := bucketedReserver(t, c, n, WithPrefix("spread"+strconv.Itoa(n)))
				sku := "hot-" + strconv.Itoa(n)
				require.NoError(t, r.Load(ctx, sku, 100))
				for i := range 20 {
					_, err := r.Deduct(ctx, Request{SKU: sku, ID: "o" + strconv.Itoa(i), User: "u" + strconv.Itoa(i), Qty: 1})
					require.NoError(t, err)
				}
				masters := map[int]bool{}
				for i := range n {
					k := r.item(bucketName(sku, i))
					lo, hi := protocol.BucketSlots(i, n)
					for _, key := range k.All() {
						slot, err := c.Do(ctx, c.B().ClusterKeyslot().Key(key).Build()).AsInt64()
						require.NoError(t, err)
						assert.Equal(t, protocol.Slot(key), int(slot), "%s: Redis agrees", key)
						assert.True(t, int(slot) >= lo && int(slot) < hi, "bucket %d of %d: %s in slot %d, not in [%d, %d)", i, n, key, slot, lo, hi)
					}
					on, err := c.Do(ctx, c.B().Exists().Key(k.Item).Build()).AsInt64()
					require.NoError(t, err)
					assert.EqualValues(t, 1, on, "bucket %d's hash is under its spread keys", i)
					if n == 3 {
						masters[protocol.Slot(k.Item)*3/protocol.Slots] = true
					}
				}
				if n == 3 {
					assert.Len(t, masters, 3, "3 buckets on the 3 masters")
				}
				l := bucketLevels(t, r, sku)
				assert.EqualValues(t, 80, l.Available)
				assert.EqualValues(t, 20, l.Sold)
			}
		})
	}
}

// TestHomeBucketIsFNV1aOfTheID: a request id's home bucket (where its claim is kept) is FNV-1a
// (32 bits) of the id mod the number of buckets, as hash/fnv computes it. Every process, of
// every version, must find an id's claim in the same bucket: two versions that route apart
// during a rolling deploy would each take the id once.
func TestHomeBucketIsFNV1aOfTheID(t *testing.T) {
	ids := []string{"", "o1", "order-42", "cart-7", "h1", "x", "ünïcode", strings.Repeat("long-id-", 20)}
	for _, n := range []int{1, 2, 3, 4, 7, 16, 64} {
		for _, id := range ids {
			h := fnv.New32a()
			h.Write([]byte(id))
			want := int(h.Sum32() % uint32(n))
			if got := homeBucket(id, n); got != want {
				t.Errorf("homeBucket(%q, %d) = %d, want %d (FNV-1a mod n)", id, n, got, want)
			}
		}
	}
}
