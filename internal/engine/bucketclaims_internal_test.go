package engine

import (
	"context"
	"errors"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock/internal/protocol"
)

// routeClient counts the calls of route.lua; while gate is set, the first call waits for it to
// be closed; with fail set, every call after the first answers a broken connection instead of
// reaching Redis.
type routeClient struct {
	rueidis.Client
	calls atomic.Int64
	gate  chan struct{}
	fail  atomic.Bool
}

func (c *routeClient) isRoute(cmd rueidis.Completed) bool {
	cs := cmd.Commands()
	if len(cs) < 2 || (cs[0] != "EVALSHA" && cs[0] != "EVAL" && cs[0] != "FCALL") {
		return false
	}
	return cs[1] == protocol.Route.SHA1 || cs[1] == protocol.Route.Source || cs[1] == protocol.Route.Func
}

func (c *routeClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if c.isRoute(cmd) {
		n := c.calls.Add(1)
		if n == 1 && c.gate != nil {
			<-c.gate
		}
		if n > 1 && c.fail.Load() {
			return rueidis.NewErrorResult(io.ErrUnexpectedEOF)
		}
	}
	return c.Client.Do(ctx, cmd)
}

// warmRoute loads route.lua where the claims hash of home bucket h of sku (of n) lives, then
// counts from zero and holds the next route call at a new gate.
func warmRoute(t *testing.T, r *Reserver, rc *routeClient, sku string, h, n int) {
	t.Helper()
	for i := 0; ; i++ {
		if id := "warm-" + strconv.Itoa(i); homeBucket(id, n) == h {
			_, _, err := r.route(context.Background(), sku, id, n, h, false)
			require.NoError(t, err)
			break
		}
	}
	rc.calls.Store(0)
	rc.gate = make(chan struct{})
}

// queued waits until n claims are queued on the claims hash of home bucket h of sku (of nb).
func queued(t *testing.T, r *Reserver, sku string, h, nb, n int) {
	t.Helper()
	key := r.item(bucketName(sku, h)).Claims
	require.Eventually(t, func() bool { return r.claims.Queued(key) == n }, 10*time.Second, time.Millisecond, "%d claims queued", n)
}

// TestCoalescedClaims: claims of one home bucket sent while another is in flight go out as one
// call of route.lua, and each caller gets its id's claim: copies of one id, sent by buyers of
// different buckets at once, all get the bucket the first of them claimed; distinct ids each get
// their own.
func TestCoalescedClaims(t *testing.T) {
	eachClient(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		rc := &routeClient{Client: c}
		r := bucketedReserver(t, rc, 3, WithCoalescing(1), WithPrefix("cc"))
		const sku, n = "cc", 3
		warmRoute(t, r, rc, sku, 0, n)
		// ids whose home bucket is 0: the same claims hash
		var ids []string
		for i := 0; len(ids) < 20; i++ {
			if id := "id-" + strconv.Itoa(i); homeBucket(id, n) == 0 {
				ids = append(ids, id)
			}
		}
		type answer struct {
			id string
			b  int
		}
		answers := make(chan answer, 100)
		var wg sync.WaitGroup
		call := func(id string, want int) {
			defer wg.Done()
			b, _, err := r.route(ctx, sku, id, n, want, false)
			assert.NoError(t, err)
			answers <- answer{id, b}
		}
		wg.Add(1)
		go call(ids[0], 1) // in flight, held at the gate
		require.Eventually(t, func() bool { return rc.calls.Load() == 1 }, 10*time.Second, time.Millisecond)
		queuedN := 0
		for k := range 3 { // three copies of each id, by buyers of buckets 0, 1, 2 at once
			for _, id := range ids {
				wg.Add(1)
				go call(id, (k+len(id))%n)
				queuedN++
			}
		}
		queued(t, r, sku, 0, n, queuedN)
		close(rc.gate)
		wg.Wait()
		close(answers)
		assert.EqualValues(t, 2, rc.calls.Load(), "the %d queued claims went out as one call", queuedN)
		got := map[string]int{}
		for a := range answers {
			if b, ok := got[a.id]; ok {
				assert.Equal(t, b, a.b, "%s: every copy gets the one claim", a.id)
			}
			got[a.id] = a.b
		}
		require.Len(t, got, len(ids))
		for _, id := range ids {
			s, err := c.Do(ctx, c.B().Hget().Key(r.item(bucketName(sku, 0)).Claims).Field(id).Build()).ToString()
			require.NoError(t, err)
			assert.Equal(t, strconv.Itoa(got[id]), s, "%s: the answer is the stored claim", id)
		}
		assert.Equal(t, 1, got[ids[0]], "the first claim of ids[0] was the call in flight")
	})
}

// TestCoalescedClaimsDeductCopies: concurrent copies of one deduct on a split item take once and
// all answer the same receipt; concurrent deducts of distinct ids all take.
func TestCoalescedClaimsDeductCopies(t *testing.T) {
	eachClient(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		r := bucketedReserver(t, c, 3, WithCoalescing(1), WithPrefix("cd"))
		require.NoError(t, r.Load(ctx, "cd", 1000))
		var wg sync.WaitGroup
		receipts := make(chan Receipt, 64)
		for i := range 64 {
			wg.Go(func() {
				if i%2 == 0 { // copies of one request
					rc, err := r.Deduct(ctx, Request{SKU: "cd", ID: "same", User: "alice", Qty: 3})
					assert.NoError(t, err)
					receipts <- rc
					return
				}
				_, err := r.Deduct(ctx, Request{SKU: "cd", ID: "o" + strconv.Itoa(i), User: "u" + strconv.Itoa(i), Qty: 1})
				assert.NoError(t, err)
			})
		}
		wg.Wait()
		close(receipts)
		var first *Receipt
		for rc := range receipts {
			if first == nil {
				first = &rc
			}
			assert.Equal(t, first.Remaining, rc.Remaining, "every copy answers the one take")
			assert.EqualValues(t, 3, rc.Qty)
		}
		l := bucketLevels(t, r, "cd")
		assert.EqualValues(t, 3+32, l.Sold, "one take of the copies, one of each other id")
	})
}

// TestCoalescedClaimsBatchBroken: a batch of claims whose connection breaks answers every claim
// of it with ErrUnknownOutcome; a queued claim whose context ends first leaves the queue with
// its context's error and nothing sent for it; the lane goes on serving later claims.
func TestCoalescedClaimsBatchBroken(t *testing.T) {
	// A claim whose caller stopped waiting for its batch answers ErrUnknownOutcome.
	require.ErrorIs(t, claimUnawaited(context.Canceled), ErrUnknownOutcome)
	eachClient(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		rc := &routeClient{Client: c}
		r := bucketedReserver(t, rc, 2, WithCoalescing(1), WithPrefix("cb"))
		const sku, n = "cb", 2
		warmRoute(t, r, rc, sku, 1, n)
		rc.fail.Store(true)
		var ids []string
		for i := 0; len(ids) < 9; i++ {
			if id := "id-" + strconv.Itoa(i); homeBucket(id, n) == 1 {
				ids = append(ids, id)
			}
		}
		var wg sync.WaitGroup
		wg.Go(func() {
			_, _, err := r.route(ctx, sku, ids[0], n, 0, false)
			assert.NoError(t, err, "the call in flight reaches Redis")
		})
		require.Eventually(t, func() bool { return rc.calls.Load() == 1 }, 10*time.Second, time.Millisecond)
		errs := make(chan error, len(ids))
		for _, id := range ids[1:7] {
			wg.Go(func() {
				_, _, err := r.route(ctx, sku, id, n, 1, false)
				errs <- err
			})
		}
		queued(t, r, sku, 1, n, 6)
		short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		_, _, err := r.route(short, sku, ids[7], n, 1, false)
		assert.ErrorIs(t, err, context.DeadlineExceeded, "a queued claim is bounded by its context")
		assert.False(t, errors.Is(err, ErrUnknownOutcome), "nothing was sent for it: %v", err)
		close(rc.gate)
		wg.Wait()
		close(errs)
		k := 0
		for err := range errs {
			assert.ErrorIs(t, err, ErrUnknownOutcome, "every claim of the broken batch")
			k++
		}
		assert.Equal(t, 6, k)
		assert.EqualValues(t, 2, rc.calls.Load(), "one call in flight, one batch; none for the claim that left")
		for _, id := range append(ids[1:8:8], ids[8]) {
			ok, err := c.Do(ctx, c.B().Hexists().Key(r.item(bucketName(sku, 1)).Claims).Field(id).Build()).AsBool()
			require.NoError(t, err)
			assert.False(t, ok, "%s: no claim written", id)
		}
		rc.fail.Store(false) // the connection is back
		b, _, err := r.route(ctx, sku, ids[8], n, 0, false)
		require.NoError(t, err)
		assert.Equal(t, 0, b)
	})
}

// TestRouteRefusesBadPairs: route.lua checks every pair before its first write.
func TestRouteRefusesBadPairs(t *testing.T) {
	eachClient(t, func(t *testing.T, c rueidis.Client) {
		ctx := context.Background()
		key := "rb:{x|0}:i"
		for _, args := range [][]string{{"a", "1", "b", "x"}, {"a", "1", "", "2"}, {"a", "1", "b"}, {}} {
			err := protocol.Route.Exec(ctx, c, []string{key}, args).Error()
			assert.Error(t, err, "%q", args)
			n, err := c.Do(ctx, c.B().Exists().Key(key).Build()).AsInt64()
			require.NoError(t, err)
			assert.Zero(t, n, "%q: nothing written", args)
		}
	})
}
