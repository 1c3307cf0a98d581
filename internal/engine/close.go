package engine

import (
	"context"
	"fmt"
	"time"
)

// Close ends r's use: it refuses new calls, stops a Run in progress (as if its context ended:
// the relay delivers what is due, for up to RunOptions.Drain), waits for the calls in flight,
// for the due-work hints they left (written a moment after a call returns, by a goroutine of
// the Reserver) and for the work that goes on detached from its caller (a batch of coalesced
// claims, a Store call Run stopped waiting for: its later commands are refused). Once Close
// returned nil, r writes nothing more to Redis: a test or a service may remove its keys.
//
// After Close, every method (Run, Consume and the operations of package stockops too) returns
// an error wrapping ErrReserverClosed and sends nothing; a call already in flight when Close
// began runs to its end. Close never closes the client, which the caller owns.
//
// ctx bounds only the wait: when it ends first, Close returns its error (the Reserver is closed
// all the same, and what was in flight may still write until it ends; a later Close waits
// again). The wait is bounded anyway: by Drain for a Run, by WithTimeout for each command.
// Close is idempotent and safe for concurrent use with every other method.
func (r *Reserver) Close(ctx context.Context) error {
	r.closeOnce.Do(func() {
		r.closeDone = make(chan struct{})
		go r.shutdown()
	})
	select {
	case <-r.closeDone:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stock: close: still waiting for work in flight: %w", ctx.Err())
	}
}

// shutdown is Close's work, done once: refuse calls, stop Run, wait for the calls, the hint
// writer and the commands in flight.
func (r *Reserver) shutdown() {
	r.runMu.Lock()
	r.closing = true
	stops := r.runs
	r.runs = nil
	r.runMu.Unlock()
	zero := r.calls.Shut()
	// The calls in flight end before a Run's last delivery starts, so that it delivers their
	// events too (each Run is one of the calls); bounded as each of their commands is.
	for deadline := time.Now().Add(r.opts.timeout); r.calls.InFlight() > int64(len(stops)) && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	for _, stop := range stops {
		stop(ErrReserverClosed)
	}
	<-zero
	if r.hints != nil {
		r.hints.stop()
	}
	if r.cmds != nil {
		<-r.cmds.Shut()
	}
	close(r.closeDone)
}

// enter admits a call, or returns ErrReserverClosed once Close began. A call that entered
// leaves (r.calls.leave) when it ends.
func (r *Reserver) enter() error {
	if !r.calls.Enter() {
		return ErrReserverClosed
	}
	return nil
}

// isClosed reports whether Close began.
func (r *Reserver) isClosed() bool {
	r.runMu.Lock()
	defer r.runMu.Unlock()
	return r.closing
}

// startRun registers a Run: Close stops it through ctx, with ErrReserverClosed as the cause.
// It returns ErrReserverClosed once Close began.
func (r *Reserver) startRun(ctx context.Context) (context.Context, func(), error) {
	ctx, cancel := context.WithCancelCause(ctx)
	key := new(int)
	r.runMu.Lock()
	defer r.runMu.Unlock()
	if r.closing {
		cancel(nil)
		return ctx, nil, ErrReserverClosed
	}
	if r.runs == nil {
		r.runs = map[*int]context.CancelCauseFunc{}
	}
	r.runs[key] = cancel
	return ctx, func() {
		r.runMu.Lock()
		delete(r.runs, key)
		r.runMu.Unlock()
		cancel(nil)
	}, nil
}
