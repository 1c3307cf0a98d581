package stock_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/memstore"
)

// runThenCancel is a client that, once armed, sends the first command match accepts, then
// cancels the caller's context and answers as a cancelled call does: the command ran in Redis,
// the caller cannot know.
type runThenCancel struct {
	rueidis.Client
	mu     sync.Mutex
	match  func(cmd []string) bool
	cancel context.CancelFunc
}

func (c *runThenCancel) arm(match func([]string) bool, cancel context.CancelFunc) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.match, c.cancel = match, cancel
}

func (c *runThenCancel) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	c.mu.Lock()
	hit := c.match != nil && c.match(cmd.Commands())
	if hit {
		c.match = nil
	}
	c.mu.Unlock()
	if !hit {
		return c.Client.Do(ctx, cmd)
	}
	_ = c.Client.Do(context.WithoutCancel(ctx), cmd).Error()
	c.cancel()
	return c.Client.Do(ctx, c.Client.B().Ping().Build()) // ctx is done: the cancelled call's answer
}

// A relay or a reconciler stopped while the command that takes an item's lease was on its way
// gives the lease back: the command may have run, and its lease would keep every other relay
// and reconcile pass off the item until it ran out (a reconcile pass right after a Run stopped
// reported the item busy).
func TestStoppedWhileTakingTheLeaseGivesItBack(t *testing.T) {
	const lease = "stock:{A}:rl"
	for _, who := range []string{"relay", "reconciler"} {
		t.Run(who, func(t *testing.T) {
			m, c := redistest.Miniredis(t)
			rc := &runThenCancel{Client: c}
			r := newReserver(t, rc)
			store := memstore.New()
			ctx := context.Background()
			for _, sku := range []string{"A", "B"} {
				require.NoError(t, r.Load(ctx, sku, 5))
				require.NoError(t, store.Load(ctx, sku, 5))
			}
			relay := newRelay(t, r, store, nil, nil)
			rec := newReconciler(t, r, store, nil)
			// Every script is loaded: the armed command runs, it is not refused as NOSCRIPT.
			must(t)(r.Deduct(ctx, stock.Request{SKU: "B", ID: "b1", Qty: 1}))
			_, err := relay.Once(ctx)
			require.NoError(t, err)
			_, err = rec.Pass(ctx)
			require.NoError(t, err)

			must(t)(r.Deduct(ctx, stock.Request{SKU: "A", ID: "a1", Qty: 1}))
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			if who == "relay" {
				rc.arm(func(cmd []string) bool { // the claim script, which takes the lease
					return (cmd[0] == "EVALSHA" || cmd[0] == "FCALL") && slices.Contains(cmd, lease)
				}, cancel)
				_, err = relay.Once(cctx)
			} else {
				rc.arm(func(cmd []string) bool {
					return cmd[0] == "SET" && len(cmd) > 1 && cmd[1] == lease && slices.Contains(cmd, "NX")
				}, cancel)
				_, err = rec.Pass(cctx)
			}
			require.ErrorIs(t, err, context.Canceled)
			require.False(t, m.Exists(lease), "the lease taken by the cancelled call is left: %q", m.Keys())
		})
	}
}
