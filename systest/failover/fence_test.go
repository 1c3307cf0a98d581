package failover_test

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// TestFenceLiftedByAnyCompletePass: a guarded Reserver is fenced; a Reconciler on another
// Reserver, which has no FailoverGuard (another process, the CLI), completes a repairing pass
// over every item; the guard unfences at its next check. Before, only a Reconciler of a guarded
// Reserver recorded the reconciled primaries. A dry run and a pass limited to some items do
// not lift the fence.
func TestFenceLiftedByAnyCompletePass(t *testing.T) {
	if os.Getenv(redistest.EnvServer) == "" {
		t.Skip("needs a real redis-server (INFO for the guard): set " + redistest.EnvServer)
	}
	ctx := context.Background()
	srv := redistest.StartServer(t)
	c := srv.Client(t)
	guarded := testkit.NewReserver(t, c)
	other := testkit.NewReserver(t, srv.Client(t))
	store := memstore.New()
	require.NoError(t, other.Load(ctx, "A", 10))
	require.NoError(t, store.Load(ctx, "A", 10))
	// The first Load recorded the epoch (a new deployment is not fenced); its loss, with the
	// items still there, is what a guard cannot tell from lost writes.
	require.NoError(t, c.Do(ctx, c.B().Del().Key("stock:epoch").Build()).Error())
	g := stockops.NewFailoverGuard(guarded)
	fenced, err := g.Check(ctx) // items, and no epoch recorded: fenced
	require.NoError(t, err)
	require.True(t, fenced)

	for _, opts := range []*stock.ReconcileOptions{{DryRun: true}, {Items: []string{"A"}}} {
		rec, err := stockops.NewReconciler(other, store, opts)
		require.NoError(t, err)
		res, err := rec.Pass(ctx)
		require.NoError(t, err)
		assert.False(t, res.EpochRecorded)
		fenced, err = g.Check(ctx)
		require.NoError(t, err)
		require.True(t, fenced, "a dry run or a partial pass does not lift the fence")
	}

	rec, err := stockops.NewReconciler(other, store, nil)
	require.NoError(t, err)
	res, err := rec.Pass(ctx)
	require.NoError(t, err)
	assert.True(t, res.Complete)
	assert.True(t, res.EpochRecorded)
	fenced, err = g.Check(ctx)
	require.NoError(t, err)
	assert.False(t, fenced, "a complete pass lifts the fence, wherever it ran")
	_, err = guarded.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1})
	require.NoError(t, err)
}
