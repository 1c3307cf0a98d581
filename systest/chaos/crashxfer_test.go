package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/protocol"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// The environment of a buyer child process (see TestTransferChildProcess).
const (
	xferEnvChild   = "STOCK_XFER_CHILD"   // "1" in a child
	xferEnvAddrs   = "STOCK_XFER_ADDRS"   // the Redis addresses, comma-separated
	xferEnvCluster = "STOCK_XFER_CLUSTER" // "1" for a cluster client
	xferEnvSKU     = "STOCK_XFER_SKU"     // the split item
	xferEnvRun     = "STOCK_XFER_RUN"     // the child's number: a prefix of its request ids
)

// Figures of TestTransferKilledProcess.
const (
	xferBuckets   = 3
	xferLoaded    = 120 // 40 units a bucket: far less than the buyers hold at once
	xferBuyers    = 6   // goroutines of a child for each of buckets 0 and 1
	xferHoldTTL   = 100 * time.Millisecond
	xferConfirm   = 300                    // a child confirms one hold in this many
	xferMinKills  = 25                     // kills wanted, unless the budget runs out first (a slow start of the child: -race, a loaded machine)
	xferLeastKill = 10                     // kills required in any case
	xferMinCut    = 3                      // kills that must leave a transfer in flight
	xferMaxLife   = 300 * time.Millisecond // a child is killed at most this long after it is ready
	xferBudget    = 30 * time.Second       // for the kills (the test stops earlier once the minimums are met)
)

// fnvMod is the library's bucket of a user or an id: FNV-1a of the key, mod n (see README,
// "Routing").
func fnvMod(key string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % uint32(n))
}

// xferUsers returns the buyers of a child: xferBuyers whose requests go to bucket 0, then
// xferBuyers whose requests go to bucket 1. Bucket 2 has none: a donor only.
func xferUsers() []string {
	var us []string
	for b := range 2 {
		for i, n := 0, 0; n < xferBuyers; i++ {
			if u := "buyer" + strconv.Itoa(i); fnvMod(u, xferBuckets) == b {
				us = append(us, u)
				n++
			}
		}
	}
	return us
}

// xferAck is a request a child acknowledged: a hold, a deduct or a restock.
type xferAck struct {
	kind      stock.Kind // stock.KindHold, KindDeduct or KindRestock
	qty       int64
	confirmed bool // a hold's Confirm returned too
	cancelled bool // a hold's Cancel returned too
	restored  bool // a deduct's Restore returned too
}

// TestTransferKilledProcess: buyers in a child process, whose requests go to bucket 0 or 1 of
// an item split over three buckets, hold units far beyond the stock (those of bucket 0 let
// their holds expire and confirm a few; those of bucket 1 cancel theirs at once; beside them a
// buyer of bucket 0 buys, a buyer of bucket 1 buys and restores each sale, and restocks go to
// every bucket), so that the buckets run dry again and again and stock moves between them all
// the time, units given back in one bucket sold in another; the child is
// killed with SIGKILL at random moments, many times, and some kills cut a transfer half way
// (after xout, or after xin and before xdone), which the test sees in the buckets' in-flight
// sets. Then recovery runs as an operator runs it (Reserver.Run's sweeper, which completes a
// transfer once the 5 s grace is over; then the relay into the Store) and nothing is lost or
// doubled: no transfer is left in flight; every bucket accounts for its stock (available +
// held + sold - t = loaded); Levels add up; every hold, confirmation and cancel the child
// acknowledged is in the ledger with its quantity, and a retry of it takes nothing more;
// buyers who want more than is left then buy every unit (Sold == Loaded: no unit stranded in a
// transfer); and the Store, which the relay hands each restock and restore before the sales of
// other buckets that spend their units, refuses no sale and agrees with Redis (a reconcile
// pass finds no drift).
//
// Standalone Redis and the 3-master cluster, with STOCK_REDIS_SERVER only: the child must
// reach the same Redis, and miniredis lives in this process.
func TestTransferKilledProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the killed-transfer test runs for about half a minute a backend")
	}
	if redistest.ServerBinary(t) == "" {
		t.Skipf("%s is not set: the killed-transfer test needs a real redis-server that a child process can reach", redistest.EnvServer)
	}
	testkit.Backends(t, func(t *testing.T, b redistest.Backend) {
		if !b.Real() {
			t.Skip("miniredis lives in this process: a child process cannot share it")
		}
		if b.Sentinel() != nil {
			t.Skip("the child reaches Redis by address (a standalone server or cluster nodes), not through sentinels")
		}
		killedTransfers(t, b)
	})
}

func killedTransfers(t *testing.T, b redistest.Backend) {
	ctx := context.Background()
	began := time.Now()
	c := b.Client(t)
	r := testkit.NewReserver(t, c, stock.WithBuckets(func(string) int { return xferBuckets }))
	const sku = "xfer"
	store := memstore.New()
	require.NoError(t, r.Load(ctx, sku, xferLoaded))
	require.NoError(t, store.Load(ctx, sku, xferLoaded))
	bucketKey := func(i int) string { return protocol.BucketBase("stock", sku, i, xferBuckets) }

	// Children, each killed at a random moment. After each kill, the transfers in flight that
	// were not before are the ones it cut.
	env := append(os.Environ(),
		xferEnvChild+"=1",
		xferEnvAddrs+"="+strings.Join(b.Addrs(), ","),
		xferEnvSKU+"="+sku,
	)
	if b.Name == "cluster" {
		env = append(env, xferEnvCluster+"=1")
	}
	acks := map[string]*xferAck{}
	seen := map[string]bool{} // transfer ids seen in flight
	var kills, cut, cutAfterIn, started int
	inFlight := func() map[string]int { // tid -> donor
		out := map[string]int{}
		for i := range xferBuckets {
			tids, err := c.Do(ctx, c.B().Zrange().Key(bucketKey(i)+":xf").Min("0").Max("-1").Build()).AsStrSlice()
			require.NoError(t, err)
			for _, tid := range tids {
				out[tid] = i
			}
		}
		return out
	}
	deadline := began.Add(xferBudget)
	for !t.Failed() && (kills < xferMinKills || cut < xferMinCut) && time.Now().Before(deadline) {
		ch := startXferChild(t, env, started)
		started++
		time.Sleep(rand.N(xferMaxLife))
		killed := ch.kill()
		for id, a := range ch.acks() {
			_, dup := acks[id]
			require.False(t, dup, "%s acknowledged by two children", id)
			acks[id] = a
		}
		msg := ch.failure()
		require.EqualValues(t, "", msg, "buyer child failed:\n%s", msg)
		if !killed {
			t.Fatalf("buyer child ended by itself (%v):\n%s", ch.cmd.ProcessState, ch.tail())
		}
		kills++
		time.Sleep(20 * time.Millisecond) // what the child had sent before it died is run
		fresh := false
		for tid, donor := range inFlight() {
			if seen[tid] {
				continue
			}
			seen[tid], fresh = true, true
			// Where the cut was: after xin (the target has the transfer) or before it.
			x, err := c.Do(ctx, c.B().Hget().Key(bucketKey(donor)+":x").Field(tid).Build()).ToString()
			require.NoError(t, err, "the donor's entry of transfer %s", tid)
			other, err := strconv.Atoi(strings.Split(x, "|")[1])
			require.NoError(t, err, x)
			in, err := c.Do(ctx, c.B().Hexists().Key(bucketKey(other)+":x").Field(tid).Build()).AsBool()
			require.NoError(t, err)
			if in {
				cutAfterIn++
			}
		}
		if fresh {
			cut++
		}
	}
	require.False(t, t.Failed())
	confirmed := 0
	for _, a := range acks {
		if a.confirmed {
			confirmed++
		}
	}
	t.Logf("%d children started, %d SIGKILLed in %v; %d kills left a transfer in flight (%d transfers, %d of them after xin); "+
		"%d requests acknowledged (holds, sales, restocks), %d holds confirmed", started, kills, time.Since(began).Round(time.Millisecond), cut, len(seen),
		cutAfterIn, len(acks), confirmed)
	assert.GreaterOrEqual(t, kills, xferLeastKill)
	assert.GreaterOrEqual(t, cut, xferMinCut, "kills that cut a transfer half way")
	assert.NotEmpty(t, acks)

	// The cut transfers are still in flight: the stock they carry is counted, not sellable.
	before := inFlight()
	testkit.Levels(t, r, sku)

	// Recovery, as an operator runs it: Reserver.Run's sweeper (without a Store, so that no
	// reconcile pass mends what the checks below look for; the relay runs after), until no
	// transfer is in flight, which the sweeper does once the 5 s grace is over.
	rctx, cancel := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() { runDone <- r.Run(rctx, stock.RunOptions{}) }()
	stopRun := sync.OnceValue(func() error {
		cancel()
		if err := <-runDone; !errors.Is(err, context.Canceled) {
			return err
		}
		return nil
	})
	defer stopRun()
	recovered := time.Now()
	for len(inFlight()) > 0 && time.Since(recovered) < 15*time.Second {
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("recovery: %d transfers in flight; %d left after %v", len(before), len(inFlight()), time.Since(recovered).Round(time.Millisecond))
	assert.Empty(t, inFlight(), "transfers left in flight after recovery")

	// Every bucket accounts for its stock; the item as a whole too.
	var sumLoaded int64
	loaded := testkit.Levels(t, r, sku).Loaded // the restocks add to xferLoaded
	for i := range xferBuckets {
		vs, err := c.Do(ctx, c.B().Hmget().Key(bucketKey(i)).Field("a", "h", "s", "l", "t").Build()).ToArray()
		require.NoError(t, err)
		var f [5]int64
		for j, v := range vs {
			if !v.IsNil() {
				f[j], err = v.AsInt64()
				require.NoError(t, err)
			}
		}
		assert.Equal(t, f[3], f[0]+f[1]+f[2]-f[4], "bucket %d: available + held + sold - t = loaded: %v", i, f)
		sumLoaded += f[3]
	}
	assert.Equal(t, loaded, sumLoaded)
	l, entries := testkit.CheckLedger(t, r, sku, xferLoaded)
	assert.Equal(t, loaded, l.Loaded)

	// Every acknowledged hold is in the ledger with its quantity, every acknowledged
	// confirmation sold; a retry takes nothing more.
	users := xferUsers()
	for id, a := range acks {
		e, ok := entries[id]
		if !assert.True(t, ok, "acknowledged %s is not in the ledger", id) {
			continue
		}
		assert.Equal(t, a.kind, e.Kind, id)
		assert.Equal(t, a.qty, e.Qty, id)
		switch a.kind {
		case stock.KindRestock:
			rc, err := r.Restock(ctx, sku, id, a.qty)
			if assert.NoError(t, err, id) {
				assert.True(t, rc.Replayed, id)
			}
			continue
		case stock.KindDeduct:
			if a.restored {
				assert.Equal(t, stock.StateRestored, e.State, id)
			} else {
				// Sold; or, for a buyer of bucket 1, restored by a Restore the kill cut short of
				// its report.
				restoredUnsaid := strings.HasPrefix(id, "e") && e.State == stock.StateRestored
				assert.True(t, e.Taken() || restoredUnsaid, "%s was sold: %+v", id, e)
			}
			user := users[0]
			if strings.HasPrefix(id, "e") {
				user = users[xferBuyers]
			}
			rc, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: user, Qty: 1})
			if a.restored || e.State == stock.StateRestored {
				assert.ErrorIs(t, err, stock.ErrRestored, id)
			} else if assert.NoError(t, err, id) {
				assert.True(t, rc.Replayed, id)
			}
			continue
		}
		if a.confirmed {
			assert.True(t, e.Taken() && e.State != stock.StateHeld, "%s was confirmed: %+v", id, e)
			rc, err := r.Confirm(ctx, sku, id)
			if assert.NoError(t, err, id) {
				assert.True(t, rc.Replayed, id)
			}
		} else if a.cancelled {
			// A Cancel that came after the hold's deadline (a slow child: -race, a loaded
			// machine) is a replay of its expiry.
			assert.Contains(t, []stock.State{stock.StateCancelled, stock.StateExpired}, e.State, id)
			rc, err := r.Cancel(ctx, sku, id)
			if assert.NoError(t, err, id) {
				assert.True(t, rc.Replayed, id)
			}
		} else if e.State == stock.StateHeld || e.State == stock.StateExpired {
			_, err := r.Hold(ctx, stock.Request{SKU: sku, ID: id, User: xferUserOf(id, users), Qty: a.qty}, xferHoldTTL)
			assert.ErrorIs(t, err, stock.ErrExpired, "a retry of expired hold %s", id)
		}
	}
	l2 := testkit.Levels(t, r, sku)
	assert.Equal(t, l.Sold, l2.Sold, "retries of acknowledged holds sold nothing")

	// Buyers who want more than is left buy every unit: none is stranded in a transfer.
	var bought int64
	for i := 0; ; i++ {
		id := "final" + strconv.Itoa(i)
		_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: users[i%len(users)], Qty: 1})
		if errors.Is(err, stock.ErrSoldOut) {
			break
		}
		require.NoError(t, err, id)
		bought++
		require.LessOrEqual(t, bought, loaded, "sold more than loaded")
	}
	l = testkit.Levels(t, r, sku)
	assert.Equal(t, stock.Levels{Sold: loaded, Loaded: loaded}, l, "every unit sold after recovery (%d bought at the end)", bought)

	// The store, once the relay has delivered everything, agrees with Redis.
	require.NoError(t, stopRun())
	rl, err := stockops.NewRelay(r, store, nil, nil)
	require.NoError(t, err)
	st := testkit.Drain(t, rl)
	assert.Zero(t, st.Refused, "sales the store refused")
	rem, err := store.Remaining(ctx, sku)
	require.NoError(t, err)
	assert.Zero(t, rem, "the store's remaining stock")
	rcl, err := stockops.NewReconciler(r, store, nil)
	require.NoError(t, err)
	rep, err := rcl.Item(ctx, sku)
	require.NoError(t, err)
	assert.Zero(t, rep.Drift, "%v", rep)
	assert.Zero(t, rep.Adjusted, "%v", rep)
	assert.Empty(t, rep.NeedsHuman, "%v", rep)
	assert.LessOrEqual(t, store.MaxApplications(), 1, "an event applied twice")
	t.Logf("after recovery: %d units bought until sold out; %+v; total %v", bought, l, time.Since(began).Round(time.Millisecond))
}

// xferUserOf returns the buyer of a child's request id ("k<child>-<goroutine>-<n>").
func xferUserOf(id string, users []string) string {
	parts := strings.Split(id, "-")
	g, _ := strconv.Atoi(parts[1])
	return users[g]
}

// xferChild is one buyer child process and the requests it reported: "xfer-held <id> <qty>",
// "xfer-deducted <id> <qty>" and "xfer-restocked <id> <qty>" for each that returned a receipt,
// "xfer-confirmed <id>", "xfer-cancelled <id>" and "xfer-restored <id>" for each confirmation,
// cancel and restore that did, "xfer-fail <message>" for anything unexpected.
type xferChild struct {
	*childProc
	got   map[string]*xferAck
	fails []string
}

// startXferChild starts child number run and waits until it is ready.
func startXferChild(t *testing.T, env []string, run int) *xferChild {
	t.Helper()
	ch := &xferChild{got: map[string]*xferAck{}}
	var err error
	ch.childProc, err = startChild("TestTransferChildProcess", append(env, xferEnvRun+"="+strconv.Itoa(run)), "xfer-ready", ch.read)
	require.NoError(t, err)
	t.Cleanup(func() { ch.kill() })
	if err := ch.awaitReady(30 * time.Second); err != nil {
		t.Fatalf("buyer child: %v:\n%s", err, ch.tail())
	}
	return ch
}

// read records what one line of the child's output reports (under ch.mu).
func (ch *xferChild) read(l string) {
	f := strings.Fields(l)
	switch {
	case len(f) == 3 && (f[0] == "xfer-held" || f[0] == "xfer-deducted" || f[0] == "xfer-restocked"):
		q, err := strconv.ParseInt(f[2], 10, 64)
		if _, dup := ch.got[f[1]]; dup || err != nil {
			ch.fails = append(ch.fails, "bad or repeated ack: "+l)
		}
		kind := map[string]stock.Kind{"xfer-held": stock.KindHold, "xfer-deducted": stock.KindDeduct, "xfer-restocked": stock.KindRestock}[f[0]]
		ch.got[f[1]] = &xferAck{kind: kind, qty: q}
	case len(f) == 2 && f[0] == "xfer-restored":
		if a := ch.got[f[1]]; a == nil || a.kind != stock.KindDeduct {
			ch.fails = append(ch.fails, "before the deduct: "+l)
		} else {
			a.restored = true
		}
	case len(f) == 2 && (f[0] == "xfer-confirmed" || f[0] == "xfer-cancelled"):
		if a := ch.got[f[1]]; a == nil {
			ch.fails = append(ch.fails, "before the hold: "+l)
		} else if f[0] == "xfer-confirmed" {
			a.confirmed = true
		} else {
			a.cancelled = true
		}
	case len(f) > 0 && f[0] == "xfer-fail":
		ch.fails = append(ch.fails, l)
	case strings.Contains(l, "DATA RACE"), strings.HasPrefix(l, "panic:"), strings.HasPrefix(l, "--- FAIL"):
		ch.fails = append(ch.fails, l)
	}
}

func (ch *xferChild) acks() map[string]*xferAck {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.got
}

// failure is what went wrong in the child, with the tail of its output; "" when nothing did.
func (ch *xferChild) failure() string {
	ch.mu.Lock()
	fails := strings.Join(ch.fails, "\n")
	ch.mu.Unlock()
	if fails == "" {
		return ""
	}
	return fails + "\n" + ch.tail()
}

// TestTransferChildProcess is the buyer process of TestTransferKilledProcess, which runs the
// test binary again with xferEnvChild set; otherwise it returns at once. Its buyers, whose
// requests go to bucket 0 or 1 of the item, hold units for xferHoldTTL and confirm one hold in
// xferConfirm, until the process is killed, and report each receipt on stdout once the call
// has returned it.
func TestTransferChildProcess(t *testing.T) {
	if os.Getenv(xferEnvChild) != "1" {
		return
	}
	go func() { // the parent died: so do we
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(3)
	}()
	ctx := context.Background()
	opt := rueidis.ClientOption{InitAddress: strings.Split(os.Getenv(xferEnvAddrs), ","), DisableCache: true}
	opt.ForceSingleClient = os.Getenv(xferEnvCluster) != "1"
	c, err := rueidis.NewClient(opt)
	require.NoError(t, err)
	r := testkit.NewReserver(t, c, stock.WithBuckets(func(string) int { return xferBuckets }))
	sku, run := os.Getenv(xferEnvSKU), os.Getenv(xferEnvRun)
	require.NoError(t, c.Do(ctx, c.B().Ping().Build()).Error())
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		// One write a line: a line is whole or absent when the process dies.
		_, _ = os.Stdout.WriteString(fmt.Sprintf(format, args...) + "\n")
	}
	say("xfer-ready")
	var wg sync.WaitGroup
	for g, u := range xferUsers() {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(rand.Uint64(), uint64(g)))
			for i := 0; ; i++ {
				id := fmt.Sprintf("k%s-%d-%d", run, g, i)
				q := 1 + int64(i%2)
				if g >= xferBuyers {
					q = 4
				}
				rc, err := r.Hold(ctx, stock.Request{SKU: sku, ID: id, User: u, Qty: q}, xferHoldTTL)
				switch {
				case errors.Is(err, stock.ErrSoldOut), errors.Is(err, stock.ErrInsufficient):
					time.Sleep(time.Millisecond)
					continue
				case err != nil:
					say("xfer-fail %s: %v", id, err)
					return
				case rc.Replayed || rc.Qty != q:
					say("xfer-fail %s: first use answered %+v", id, rc)
					return
				}
				say("xfer-held %s %d", id, q)
				if g >= xferBuyers { // bucket 1: gives it back at once, for bucket 0 to take
					_, err := r.Cancel(ctx, sku, id)
					if err != nil {
						say("xfer-fail cancel %s: %v", id, err)
						return
					}
					say("xfer-cancelled %s", id)
				} else if rng.IntN(xferConfirm) == 0 {
					_, err := r.Confirm(ctx, sku, id)
					switch {
					case errors.Is(err, stock.ErrExpired): // this process was slower than the hold's ttl
					case err != nil:
						say("xfer-fail confirm %s: %v", id, err)
						return
					default:
						say("xfer-confirmed %s", id)
					}
				}
			}
		})
	}
	// Plain sales and restocks beside the holds, in other buckets than the units they move: a
	// buyer of bucket 0 buys; a buyer of bucket 1 buys and restores every sale (the units go
	// back in bucket 1, and move to bucket 0 by transfers); restocks go to their ids' home
	// buckets, any of the three. The Store must get each restock and restore before the sales
	// that spend its units in another bucket (the relay's cross-bucket order).
	users := xferUsers()
	wg.Go(func() {
		for i := 0; ; i++ {
			id := fmt.Sprintf("d%s-%d", run, i)
			_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: users[0], Qty: 1})
			switch {
			case errors.Is(err, stock.ErrSoldOut), errors.Is(err, stock.ErrInsufficient):
			case err != nil:
				say("xfer-fail deduct %s: %v", id, err)
				return
			default:
				say("xfer-deducted %s 1", id)
			}
			time.Sleep(2 * time.Millisecond)
		}
	})
	wg.Go(func() {
		for i := 0; ; i++ {
			id := fmt.Sprintf("e%s-%d", run, i)
			_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, User: users[xferBuyers], Qty: 1})
			switch {
			case errors.Is(err, stock.ErrSoldOut), errors.Is(err, stock.ErrInsufficient):
				time.Sleep(time.Millisecond)
				continue
			case err != nil:
				say("xfer-fail deduct %s: %v", id, err)
				return
			}
			say("xfer-deducted %s 1", id)
			if _, err := r.Restore(ctx, sku, id); err != nil {
				say("xfer-fail restore %s: %v", id, err)
				return
			}
			say("xfer-restored %s", id)
			time.Sleep(2 * time.Millisecond)
		}
	})
	wg.Go(func() {
		for i := 0; ; i++ {
			id := fmt.Sprintf("r%s-%d", run, i)
			q := int64(1 + i%3)
			if _, err := r.Restock(ctx, sku, id, q); err != nil {
				say("xfer-fail restock %s: %v", id, err)
				return
			}
			say("xfer-restocked %s %d", id, q)
			time.Sleep(5 * time.Millisecond)
		}
	})
	wg.Wait()
	select {} // until killed
}
