package engine

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"
)

// entryClock estimates Redis's clock for deduct.lua, which then need not read it (TIME) in the
// common call of a deduct on an item with no live hold: the Reserver's clock (WithClock) plus the
// difference between Redis's clock and it, measured with TIME at most once a second. A Reserver
// whose clock is hours off thus still records Redis's time in its entries (the retention counts
// from them, and a store without a record list has nothing else to keep an entry until then).
type entryClock struct {
	offset   atomic.Int64 // Redis's clock minus the Reserver's, in ms
	measured atomic.Int64 // when offset was measured (time.Now, unix ns); 0: never
	busy     atomic.Bool  // a measure is in flight
}

// clockRefresh is how often the offset is measured again, while deducts are sent; an offset older
// than clockStale is not used (the script reads TIME).
const (
	clockRefresh = time.Second
	clockStale   = 10 * time.Second
)

// clockArg is deduct.lua's clock argument: the estimate of Redis's clock in ms, or "" when no
// recent measure of the offset is known (the script reads TIME). The call that finds the offset
// due measures it first: one TIME round trip, at most once a second; calls meanwhile use the
// last one.
func (r *Reserver) clockArg(ctx context.Context) string {
	c := &r.clock
	m := c.measured.Load()
	if time.Now().UnixNano()-m >= int64(clockRefresh) && c.busy.CompareAndSwap(false, true) {
		r.measureClock(ctx)
		c.busy.Store(false)
		m = c.measured.Load()
	}
	if m == 0 || time.Now().UnixNano()-m > int64(clockStale) {
		return ""
	}
	return strconv.FormatInt(r.opts.now().UnixMilli()+c.offset.Load(), 10)
}

// measureClock measures the offset of Redis's clock from the Reserver's with TIME, against the
// middle of the round trip. A failure keeps the last offset.
func (r *Reserver) measureClock(ctx context.Context) {
	before := r.opts.now().UnixMilli()
	t, err := r.serverNow(ctx)
	after := r.opts.now().UnixMilli()
	if err != nil {
		return
	}
	r.clock.offset.Store(t.UnixMilli() - (before+after)/2)
	r.clock.measured.Store(time.Now().UnixNano())
}
