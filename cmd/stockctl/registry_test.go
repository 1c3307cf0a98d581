package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/stockops"
)

// TestReconcileLostRegistry: Redis loses everything (FLUSHALL) after sales reached the store.
// Before, `reconcile` printed no item and exited 0, so no cron alert fired, and `reconcile
// -apply SKU` rebuilt the item without registering it, so the relay never drained it again.
func TestReconcileLostRegistry(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	require.Equal(t, exitOK, h.store("load", "A", "10").code)
	require.Equal(t, exitOK, h.store("load", "B", "3").code)
	h.deduct("o1", "alice", 2)
	require.Equal(t, exitOK, h.store("relay-once").code)
	require.NoError(t, h.client.Do(ctx, h.client.B().Flushall().Build()).Error())

	res := h.store("reconcile")
	assert.Equal(t, exitDrift, res.code, "a lost registry must alert")
	assert.Contains(t, res.out, "REDIS LOST ITS REGISTRY: 1 items")
	assert.Contains(t, res.out, "A: redis 0+0 held, store 8")
	assert.Contains(t, res.out, "in the store only, never in Redis (left alone; 'load' puts them on sale): B")
	assert.Empty(t, h.registry(), "a report-only run changes nothing")

	// One item, by name: rebuilt and registered again.
	res = h.store("reconcile", "-apply", "A")
	assert.Equal(t, exitDrift, res.code)
	assert.Contains(t, res.out, "NOT IN THE REGISTRY")
	assert.Equal(t, []string{"A"}, h.registry())
	assert.Equal(t, "8\n", h.run("available", "A").out)

	// The relay drains it again.
	_, err := h.r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", Qty: 1})
	require.NoError(t, err)
	res = h.store("relay-once")
	require.Equal(t, exitOK, res.code)
	assert.Contains(t, res.out, "delivered 1 events")

	res = h.store("reconcile")
	assert.NotContains(t, res.out, "REDIS LOST")
	assert.Contains(t, res.out, "A: redis 7+0 held, store 7")
}

// TestReconcileLiftsFence: a FailoverGuard fenced a Reserver; `stockctl reconcile -apply`, a
// complete pass in another process, lifts the fence. Before, only a pass run in the guarded
// process itself recorded the reconciled primaries, so a deployment whose only reconciler was
// the CLI stayed fenced forever.
func TestReconcileLiftsFence(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skip("needs a real redis-server (INFO for the guard): set " + redistest.EnvServer)
	}
	h := newHarness(t)
	ctx := context.Background()
	require.Equal(t, exitOK, h.store("load", "A", "10").code)
	// The first load recorded the epoch (a new deployment is not fenced); its loss, with the
	// item still there, fences.
	require.NoError(t, h.client.Do(ctx, h.client.B().Del().Key(h.prefix+":epoch").Build()).Error())
	g := stockops.NewFailoverGuard(h.r)
	fenced, err := g.Check(ctx) // items exist and no epoch recorded: fenced
	require.NoError(t, err)
	require.True(t, fenced)
	_, err = h.r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1})
	require.ErrorIs(t, err, stock.ErrFailover)

	res := h.store("reconcile") // a report-only run does not lift it
	require.Equal(t, exitOK, res.code)
	fenced, err = g.Check(ctx)
	require.NoError(t, err)
	require.True(t, fenced)
	res = h.store("reconcile", "-apply", "A") // nor does a pass over some items
	require.Equal(t, exitOK, res.code)
	fenced, err = g.Check(ctx)
	require.NoError(t, err)
	require.True(t, fenced)

	res = h.store("reconcile", "-apply")
	require.Equal(t, exitOK, res.code, res.err)
	assert.Contains(t, res.out, "the Redis primaries are recorded as reconciled")
	fenced, err = g.Check(ctx)
	require.NoError(t, err)
	assert.False(t, fenced, "the CLI's complete pass lifts the fence")
	_, err = h.r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1})
	require.NoError(t, err)
}
