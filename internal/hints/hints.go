// Package hints collects the due-work hints of package stock's Reserver: after a script call
// that may queue events (or take a hold), the item goes in a set that a goroutine of the
// Collector writes a moment later, in one batch for the calls of a burst (the engine's
// hints.go writes them to Redis and reads them back for the relay and the sweeper).
package hints

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Delay is how long the hint writer waits before a write, so that the calls of a busy
// item meet in one write.
const Delay = 2 * time.Millisecond

// Collector collects the items of recent script calls and writes them in batches, from a
// goroutine of its own that runs while there is something to write.
type Collector struct {
	write    func(ctx context.Context, relay map[string]struct{}, holds map[string]int64) error
	timeout  time.Duration
	logger   *slog.Logger
	mu       sync.Mutex
	relay    map[string]struct{}
	holds    map[string]int64 // sku -> 0: the sweeper reads the deadline (see hold)
	flushing bool
	stopped  bool       // Reserver.Close: no hint is written any more
	rounds   uint64     // write rounds completed
	idle     *sync.Cond // signalled at the end of every round, and when the writer stops
}

// New returns a Collector that writes with write, each write bounded by timeout, and logs a
// failed write to logger as a warning.
func New(write func(ctx context.Context, relay map[string]struct{}, holds map[string]int64) error, timeout time.Duration, logger *slog.Logger) *Collector {
	h := &Collector{write: write, timeout: timeout, logger: logger, relay: map[string]struct{}{}, holds: map[string]int64{}}
	h.idle = sync.NewCond(&h.mu)
	return h
}

// Events records that skus may have events to deliver.
func (h *Collector) Events(skus ...string) {
	h.mu.Lock()
	for _, sku := range skus {
		h.relay[sku] = struct{}{}
	}
	h.kick()
	h.mu.Unlock()
}

// Hold records that sku has a new hold, and events when the outbox is on. The hint is scored 0,
// "look now": the sweeper reads the hold's deadline from Redis, on Redis's clock, and scores the
// hint with it (this process's clock may not agree with Redis's).
func (h *Collector) Hold(sku string, events bool) {
	h.mu.Lock()
	if events {
		h.relay[sku] = struct{}{}
	}
	h.holds[sku] = 0
	h.kick()
	h.mu.Unlock()
}

// kick starts the writer unless it runs. h.mu is held. After stop, the hints are dropped.
func (h *Collector) kick() {
	if h.stopped {
		clear(h.relay)
		clear(h.holds)
		return
	}
	if !h.flushing {
		h.flushing = true
		go h.writer()
	}
}

// writer writes the hints collected until none is left. Hints that arrive during a write go
// in the next one, so a burst of calls costs a few writes.
func (h *Collector) writer() {
	for {
		time.Sleep(Delay)
		h.mu.Lock()
		relay, holds := h.relay, h.holds
		if len(relay) == 0 && len(holds) == 0 {
			h.flushing = false
			h.idle.Broadcast()
			h.mu.Unlock()
			return
		}
		h.relay, h.holds = map[string]struct{}{}, map[string]int64{}
		h.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), h.timeout)
		if err := h.write(ctx, relay, holds); err != nil {
			h.logger.WarnContext(ctx, "stock: due-work hints not written; the background loops' slow walk will find the work", "err", err)
		}
		cancel()
		h.mu.Lock()
		h.rounds++
		h.idle.Broadcast()
		h.mu.Unlock()
	}
}

// Flush waits until the hints recorded before it are written (or failed to be): two rounds at
// most, the one in progress and the next, however busy the Reserver stays.
func (h *Collector) Flush() {
	h.mu.Lock()
	defer h.mu.Unlock()
	target := h.rounds + 2
	for h.flushing && h.rounds < target {
		h.idle.Wait()
	}
}

// Stop waits until the writer wrote what it has and stopped, and keeps it from starting again
// (Reserver.Close): the hints recorded from then on are dropped.
func (h *Collector) Stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopped = true
	for h.flushing {
		h.idle.Wait()
	}
}
