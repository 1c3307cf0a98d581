package stock_test

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
		ctx := context.Background()
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
	ctx := context.Background()
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
	fenced, err := stockops.NewFailoverGuard(r).Check(ctx)
	require.NoError(t, err)
	require.True(t, fenced)
	mustFail(t, stock.ErrFailover)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", Qty: 1}))
	n, err := available(r.Levels(ctx, "A"))
	require.NoError(t, err)
	assert.Equal(t, int64(8), n, "a fenced deduct takes nothing")

	assert.Equal(t, map[string]int{"deduct/not_replicated": 1, "deduct/failover": 1}, seen)
}
