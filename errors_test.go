package stock_test

// What the errors say: a conflict names what differs, a reply not understood is an unknown
// outcome, and every outcome has its label.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/redis/rueidis/mock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/stockops"
)

// corruptReplies is a client whose script calls run in Redis but answer reply instead, as a
// garbled reply would: the script ran, its answer is not understood.
type corruptReplies struct {
	rueidis.Client
	reply rueidis.RedisMessage
}

func (c corruptReplies) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	name := cmd.Commands()[0] // before Do, which recycles cmd
	res := c.Client.Do(ctx, cmd)
	if (name == "EVALSHA" || name == "EVAL" || name == "FCALL") && res.Error() == nil {
		return mock.Result(c.reply)
	}
	return res
}

// TestMalformedReplyIsUnknownOutcome: a script reply this package does not understand comes
// after the script ran, so it may have written: the error is ErrUnknownOutcome, never
// ErrInvalid (whose doc says nothing changed). Before, every such reply was ErrInvalid, and a
// caller that trusted it gave up on a sale Redis had made.
func TestMalformedReplyIsUnknownOutcome(t *testing.T) {
	replies := map[string]rueidis.RedisMessage{
		"too many values":  mock.RedisArray(mock.RedisInt64(0), mock.RedisInt64(9), mock.RedisInt64(1), mock.RedisInt64(0)),
		"not an integer":   mock.RedisArray(mock.RedisInt64(0), mock.RedisString("nine"), mock.RedisInt64(1)),
		"unknown code":     mock.RedisArray(mock.RedisInt64(99), mock.RedisInt64(9), mock.RedisInt64(1)),
		"not an array":     mock.RedisString("OK"),
		"nil":              mock.RedisNil(),
		"pair, not triple": mock.RedisArray(mock.RedisInt64(0), mock.RedisInt64(9)),
	}
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		honest := newReserver(t, c)
		require.NoError(t, honest.Load(ctx, "A", 100))
		n := 0
		for name, reply := range replies {
			for _, coalescing := range []int{0, 4} {
				n++
				id := fmt.Sprintf("o%d", n)
				r := newReserver(t, corruptReplies{Client: c, reply: reply}, stock.WithCoalescing(coalescing))
				_, err := r.Deduct(ctx, stock.Request{SKU: "A", ID: id, Qty: 1})
				require.ErrorIs(t, err, stock.ErrUnknownOutcome, "%s (coalescing %d)", name, coalescing)
				require.NotErrorIs(t, err, stock.ErrInvalid, "%s: ErrInvalid says nothing changed, but the script ran", name)
				require.Equal(t, "error", stock.Outcome(err), "%s", name)
				// The script did run: the retry the error asks for is a replay.
				rc := must(t)(honest.Deduct(ctx, stock.Request{SKU: "A", ID: id, Qty: 1, Retry: true}))
				require.True(t, rc.Replayed, "%s: the deduct was made", name)

				_, err = r.Restore(ctx, "A", id)
				require.ErrorIs(t, err, stock.ErrUnknownOutcome, "restore, %s", name)
				require.NotErrorIs(t, err, stock.ErrInvalid)
				if name != "pair, not triple" { // the shape of close.lua's reply
					err = r.CloseItem(ctx, "A")
					require.ErrorIs(t, err, stock.ErrUnknownOutcome, "close, %s", name)
					require.NotErrorIs(t, err, stock.ErrInvalid)
					require.NoError(t, honest.ReopenItem(ctx, "A"))
				}
			}
		}
	})
}

// TestOutcomeLabels: ErrFailover (nothing sent) and ErrNotReplicated (written) have their own
// labels; before, both were "error", the label of an unknown outcome. An unknown outcome is
// "timeout" when the time ran out, "error" otherwise.
func TestOutcomeLabels(t *testing.T) {
	for err, want := range map[error]string{
		stock.ErrFailover:      "failover",
		stock.ErrNotReplicated: "not_replicated",
		fmt.Errorf("%w: WAIT: 0 of 1 replicas", stock.ErrNotReplicated):                                  "not_replicated",
		fmt.Errorf("%w: %w", stock.ErrUnknownOutcome, errors.New("EOF")):                                 "error",
		fmt.Errorf("%w: %w (%w)", stock.ErrUnknownOutcome, errors.New("dial"), context.DeadlineExceeded): "timeout",
		fmt.Errorf("%w: %w", stock.ErrUnknownOutcome, context.Canceled):                                  "canceled",
	} {
		assert.Equal(t, want, stock.Outcome(err), "%v", err)
	}
}

// TestFailoverAndNotReplicatedObserved: a fenced Deduct and a Deduct no replica acknowledged
// are observed with their own outcomes, and the second's receipt is valid.
func TestFailoverAndNotReplicatedObserved(t *testing.T) {
	if os.Getenv(redistest.EnvServer) == "" {
		t.Skip("needs a real redis-server (INFO for the guard, WAIT): set " + redistest.EnvServer)
	}
	srv := redistest.StartServer(t)
	var mu sync.Mutex
	seen := map[string]int{}
	obs := stock.ObserverFunc(func(_ context.Context, o stock.Observation) {
		mu.Lock()
		defer mu.Unlock()
		seen[o.Op+"/"+o.Outcome]++
	})

	// No replica: WAIT answers 0, the deduct is made and reported ErrNotReplicated.
	ra := newReserver(t, srv.Client(t), stock.WithReplicaAck(1, 10*time.Millisecond), stock.WithObserver(obs))
	require.NoError(t, ra.Load(ctx, "A", 10))
	rc := mustFail(t, stock.ErrNotReplicated)(ra.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 2}))
	assert.Equal(t, int64(2), rc.Qty)
	assert.Equal(t, int64(8), rc.Remaining)

	// Items but no recorded epoch (the first Load's is lost): the guard fences; Deduct sends
	// nothing.
	c := srv.Client(t)
	require.NoError(t, c.Do(ctx, c.B().Del().Key("stock:epoch").Build()).Error())
	r := newReserver(t, c, stock.WithObserver(obs))
	checkFenced(t, stockops.NewFailoverGuard(r), true)
	mustFail(t, stock.ErrFailover)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", Qty: 1}))
	assert.Equal(t, int64(8), levels(t, r, "A").Available, "a fenced deduct takes nothing")

	assert.Equal(t, map[string]int{"deduct/not_replicated": 1, "deduct/failover": 1}, seen)
}

// conflictSays asserts that err is ErrConflict and that its message says each of says, and
// none of not.
func conflictSays(t *testing.T, err error, says []string, not ...string) {
	t.Helper()
	require.ErrorIs(t, err, stock.ErrConflict)
	for _, s := range says {
		assert.Contains(t, err.Error(), s)
	}
	for _, s := range not {
		assert.NotContains(t, err.Error(), s)
	}
}

// TestConflictSaysWhatDiffers: a request id reused with other parameters is ErrConflict whose
// message names what differs from the id's first use (the kind, the quantity, the user, for a
// cart its lines), never a field that is the same, on plain and split items and for carts.
func TestConflictSaysWhatDiffers(t *testing.T) {
	eachBackend(t, func(t *testing.T, c rueidis.Client) {
		r := newReserver(t, c, splitSAndGroupG...)
		for _, sku := range []string{"A", "B", "S", "G1", "G2"} {
			require.NoError(t, r.Load(ctx, sku, 100))
		}
		deduct := func(sku, id, user string, qty int64) error {
			_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: user, Qty: qty})
			return err
		}
		hold := func(sku, id, user string, qty int64) error {
			_, err := r.Hold(ctx, stock.Request{SKU: sku, ID: id, User: user, Qty: qty}, time.Minute)
			return err
		}
		for _, sku := range []string{"A", "S"} {
			t.Run(sku, func(t *testing.T) {
				require.NoError(t, deduct(sku, "d1", "u1", 1))
				conflictSays(t, deduct(sku, "d1", "u2", 1), []string{sku + "/d1 was used by another user"}, "units", "quantity", "u1")
				conflictSays(t, deduct(sku, "d1", "u1", 3), []string{"with quantity 1, not 3"}, "user")
				conflictSays(t, deduct(sku, "d1", "", 1), []string{"by a user, not without one"}, "units")
				conflictSays(t, hold(sku, "d1", "u1", 1), []string{"was used for a deduct, not a hold"}, "units", "user")
				conflictSays(t, hold(sku, "d1", "u1", 2), []string{"was used for a deduct, not a hold; with quantity 1, not 2"}, "user")

				require.NoError(t, hold(sku, "h1", "u1", 2))
				conflictSays(t, deduct(sku, "h1", "u1", 2), []string{"was used for a hold, not a deduct"}, "units", "user")

				require.NoError(t, deduct(sku, "d2", "", 1))
				conflictSays(t, deduct(sku, "d2", "u3", 1), []string{"was used without a user, not by u3"}, "units")

				_, err := r.Confirm(ctx, sku, "d1")
				conflictSays(t, err, []string{"was used for a deduct, not a hold"}, "units")
				_, err = r.Extend(ctx, sku, "d1", time.Minute)
				conflictSays(t, err, []string{"was used for a deduct, not a hold"}, "units")
				_, err = r.Cancel(ctx, sku, "d1")
				conflictSays(t, err, []string{"was used for a deduct, not a hold"}, "units")

				must(t)(r.Restock(ctx, sku, "r1", 5))
				conflictSays(t, deduct(sku, "r1", "u1", 5), []string{"was used for a restock, not a deduct"}, "units")
				_, err = r.Restock(ctx, sku, "r1", 6)
				conflictSays(t, err, []string{"with quantity 5, not 6"}, "restock, not")
				_, err = r.Restock(ctx, sku, "d1", 1)
				conflictSays(t, err, []string{"was used for a deduct, not a restock"}, "units")
				if sku == "A" { // a split item's restock goes to a bucket the restore does not look in
					_, err = r.Restore(ctx, sku, "r1")
					conflictSays(t, err, []string{"was used for a restock, which cannot be given back"})
				}
			})
		}

		t.Run("saga cart", func(t *testing.T) {
			lines := []stock.Line{{SKU: "A", Qty: 1}, {SKU: "B", Qty: 1}}
			mustCart(t)(r.DeductMany(ctx, stock.Cart{ID: "c1", User: "u1", Lines: lines}))
			_, err := r.DeductMany(ctx, stock.Cart{ID: "c1", User: "u2", Lines: lines})
			conflictSays(t, err, []string{"cart c1 was used by another user"}, "lines", "u1")
			_, err = r.HoldMany(ctx, stock.Cart{ID: "c1", User: "u1", Lines: lines}, time.Minute)
			conflictSays(t, err, []string{"cart c1 was used for a deduct cart, not a hold cart"}, "user", "lines")
			_, err = r.DeductMany(ctx, stock.Cart{ID: "c1", User: "u1", Lines: []stock.Line{{SKU: "A", Qty: 2}}})
			conflictSays(t, err, []string{"with other lines (item A: quantity 1, not 2; item B in it too)"}, "user")
		})
		t.Run("one-slot cart", func(t *testing.T) {
			lines := []stock.Line{{SKU: "G1", Qty: 1}, {SKU: "G2", Qty: 1}}
			mustCart(t)(r.DeductMany(ctx, stock.Cart{ID: "c2", User: "u1", Lines: lines}))
			_, err := r.DeductMany(ctx, stock.Cart{ID: "c2", User: "u2", Lines: lines})
			conflictSays(t, err, []string{"G1/c2 was used by another user"}, "units")
			var ce *stock.CartError
			assert.ErrorAs(t, err, &ce)
		})
		l, _ := checkLedger(t, r, "A", 100)
		assert.Equal(t, int64(105), l.Loaded, "the conflicts changed nothing: only the restock added")
	})
}
