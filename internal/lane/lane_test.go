package lane

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLaneUnawaitedCallerStopsWaiting: with unawaited set (claims), a caller whose context ends
// while the batch it is in is being sent stops waiting at once with unawaited's error, and the
// batch goes on; the batch's leader gets its answer.
func TestLaneUnawaitedCallerStopsWaiting(t *testing.T) {
	release := make(chan struct{})
	var sends atomic.Int64
	var ls Lanes[int, int]
	ls.Send = func(_ context.Context, _ string, reqs []int, dst []int) error {
		sends.Add(1)
		<-release
		for i, q := range reqs {
			dst[i] = q * 10
		}
		return nil
	}
	ls.Unawaited = unawaited
	l, w := ls.join("k", 0, 1)
	require.Nil(t, w, "the first call goes at once")
	_, lead := ls.join("k", 1, 1)
	_, follow := ls.join("k", 2, 1)
	require.NotNil(t, lead)
	require.NotNil(t, follow)
	leadDone := make(chan int, 1)
	go func() {
		res, err := ls.wait(context.Background(), l, lead)
		assert.NoError(t, err)
		leadDone <- res
	}()
	ctx, cancel := context.WithCancel(context.Background())
	followErr := make(chan error, 1)
	go func() {
		_, err := ls.wait(ctx, l, follow)
		followErr <- err
	}()
	ls.done(l) // the first call returned: the queue is handed to its oldest waiter
	require.Eventually(t, func() bool { return sends.Load() == 1 }, 5*time.Second, time.Millisecond)
	cancel()
	select {
	case err := <-followErr:
		assert.ErrorIs(t, err, errUnknown)
		assert.ErrorIs(t, err, context.Canceled)
	case <-time.After(5 * time.Second):
		t.Fatal("a caller whose context ended still waits for its batch")
	}
	close(release)
	assert.Equal(t, 10, <-leadDone)
}

var errUnknown = errors.New("outcome unknown")

// unawaited is the error of a caller that stopped waiting for its batch, as package stock's
// claims make it.
func unawaited(ctxErr error) error { return fmt.Errorf("%w: %w", errUnknown, ctxErr) }

// TestDoUsesSendOneForACallAlone: a call with nothing in flight goes through SendOne when it is
// set (Send, the batch path, is not called) and gets SendOne's answer; the lane is then gone.
func TestDoUsesSendOneForACallAlone(t *testing.T) {
	var ls Lanes[int, int]
	ls.Send = func(context.Context, string, []int, []int) error {
		t.Error("Send called for a call alone")
		return nil
	}
	ls.SendOne = func(_ context.Context, key string, q int) (int, error) {
		assert.Equal(t, "k", key)
		return q * 10, nil
	}
	res, err := ls.Do(context.Background(), "k", 4, 1)
	require.NoError(t, err)
	assert.Equal(t, 40, res)
	assert.Zero(t, ls.Live(), "the lane of an idle key is dropped")
}

// TestLanesKeepEachKeysCallsApart: with many keys sharing shards, lanes dropped and used again
// for other keys, and batches forming (one call in flight per key), every batch carries only
// its key's requests, every caller gets its own answer, and no lane is left once all are idle.
func TestLanesKeepEachKeysCallsApart(t *testing.T) {
	type req struct {
		key string
		n   int
	}
	var ls Lanes[req, int]
	var batches atomic.Int64
	ls.Send = func(_ context.Context, key string, reqs []req, dst []int) error {
		if len(reqs) > 1 {
			batches.Add(1)
		}
		for i, q := range reqs {
			if q.key != key {
				return fmt.Errorf("request of %s in a batch of %s", q.key, key)
			}
			dst[i] = q.n * 2
		}
		return nil
	}
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Go(func() {
			for i := range 300 {
				key := fmt.Sprint("hot", (g+i)%8) // contended: batches form
				if i%4 == 0 {
					key = fmt.Sprint("k", (g+i)%97) // mostly idle: lanes dropped and used again
				}
				n := g*1000 + i
				got, err := ls.Do(context.Background(), key, req{key, n}, 1)
				if err != nil || got != 2*n {
					t.Errorf("Do(%s, %d) = %d, %v", key, n, got, err)
					return
				}
			}
		})
	}
	wg.Wait()
	assert.Zero(t, ls.Live(), "lanes left once every key is idle")
	t.Logf("%d batches of more than one request", batches.Load())
	assert.NotZero(t, batches.Load(), "no batch formed: the test did not reach the queue")
}
