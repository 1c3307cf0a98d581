package engine

import (
	"context"
	"fmt"
	"time"
)

// Close is stock.Reserver.Close.
func (r *Reserver) Close(ctx context.Context) error {
	r.closeOnce.Do(func() {
		r.closeDone = make(chan struct{})
		go r.shutdown()
	})
	select { // done already: nil, whatever ctx (a select on both would pick one at random)
	case <-r.closeDone:
		return nil
	default:
	}
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
		r.hints.Stop()
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
