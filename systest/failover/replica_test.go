package failover_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
)

func TestReplicaAckOption(t *testing.T) {
	_, c := redistest.Miniredis(t)
	_, err := stock.New(c, stock.WithReplicaAck(1, 0))
	assert.ErrorIs(t, err, stock.ErrInvalid)
	_, err = stock.New(c, stock.WithReplicaAck(-1, time.Second))
	assert.ErrorIs(t, err, stock.ErrInvalid)
}

// TestReplicaAck: with WithReplicaAck a write reports whether a replica acknowledged it; the
// write itself is made either way.
func TestReplicaAck(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skip("real-server test: set STOCK_REDIS_SERVER to run it")
	}
	ctx := context.Background()
	primary := redistest.StartServer(t)
	replica := redistest.StartServer(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port()))
	rc := replica.Client(t)
	require.Eventually(t, func() bool {
		info, err := rc.Do(ctx, rc.B().Info().Section("replication").Build()).ToString()
		return err == nil && strings.Contains(info, "master_link_status:up")
	}, 10*time.Second, 20*time.Millisecond)

	r, err := stock.New(primary.Client(t), stock.WithReplicaAck(1, 2*time.Second)) // generous: a loaded machine
	require.NoError(t, err)
	require.NoError(t, r.Load(ctx, "A", 10))
	_, err = r.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 1})
	require.NoError(t, err)
	_, err = r.Hold(ctx, stock.Request{SKU: "A", ID: "h1", Qty: 1}, time.Minute)
	require.NoError(t, err)
	_, err = r.Confirm(ctx, "A", "h1")
	require.NoError(t, err)
	// SCRIPT FLUSH: the pipelined EVALSHA falls back to EVAL, still followed by the WAIT.
	pc := primary.Client(t)
	require.NoError(t, pc.Do(ctx, pc.B().ScriptFlush().Build()).Error())
	_, err = r.Restore(ctx, "A", "o1")
	require.NoError(t, err)

	replica.Kill()
	rcpt, err := r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", Qty: 2})
	require.ErrorIs(t, err, stock.ErrNotReplicated)
	assert.Equal(t, int64(2), rcpt.Qty, "the write was made and its receipt is valid")
	l, err := r.Levels(ctx, "A")
	require.NoError(t, err)
	assert.Equal(t, stock.Levels{Available: 7, Sold: 3, Loaded: 10}, l)
	rcpt, err = r.Deduct(ctx, stock.Request{SKU: "A", ID: "o2", Qty: 2, Retry: true})
	require.ErrorIs(t, err, stock.ErrNotReplicated, "a replay is no safer than the write it replays, which no replica has")
	assert.True(t, rcpt.Replayed)
	assert.Equal(t, int64(2), rcpt.Qty)
	_, err = r.Deduct(ctx, stock.Request{SKU: "A", ID: "o3", Qty: 100})
	require.ErrorIs(t, err, stock.ErrInsufficient, "a refusal is reported as such")
}
