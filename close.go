package stock

import "context"

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
	return r.e.Close(ctx)
}
