package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/stockres/stock/internal/errs"
	"github.com/stockres/stock/internal/protocol"
)

// The sentinel errors of package stock, documented there.
var (
	ErrUnknownOutcome = errs.ErrUnknownOutcome
	ErrSoldOut        = errs.ErrSoldOut
	ErrInsufficient   = errs.ErrInsufficient
	ErrNotLoaded      = errs.ErrNotLoaded
	ErrLoaded         = errs.ErrLoaded
	ErrConflict       = errs.ErrConflict
	ErrRestored       = errs.ErrRestored
	ErrUserLimit      = errs.ErrUserLimit
	ErrUnknownID      = errs.ErrUnknownID
	ErrClosed         = errs.ErrClosed
	ErrExpired        = errs.ErrExpired
	ErrConfirmed      = errs.ErrConfirmed
	ErrNotReplicated  = errs.ErrNotReplicated
	ErrRunning        = errs.ErrRunning
	ErrInvalid        = errs.ErrInvalid
	ErrReserverClosed = errs.ErrReserverClosed
)

var codeErrs = [...]error{
	protocol.SoldOut:   ErrSoldOut,
	protocol.Short:     ErrInsufficient,
	protocol.NotLoaded: ErrNotLoaded,
	protocol.Conflict:  ErrConflict,
	protocol.Restored:  ErrRestored,
	protocol.UserLimit: ErrUserLimit,
	protocol.Closed:    ErrClosed,
	protocol.Unknown:   ErrUnknownID,
	protocol.Expired:   ErrExpired,
	protocol.Confirmed: ErrConfirmed,
	protocol.Invalid:   ErrInvalid,
}

// codeErr maps a script reply code to its error; protocol.OK and protocol.Replay map to nil, a code it
// does not know to ErrUnknownOutcome (the script may have written before it answered).
func codeErr(code int64) error {
	if code == protocol.OK || code == protocol.Replay {
		return nil
	}
	if code < 0 || code >= int64(len(codeErrs)) || codeErrs[code] == nil {
		return fmt.Errorf("%w: malformed script reply, code %d", ErrUnknownOutcome, code)
	}
	return codeErrs[code]
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// brokenConn reports whether err is a connection that broke under a command (closed by a server
// restart, reset, refused while it comes back), as opposed to a reply or a cancelled context.
func brokenConn(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var ne net.Error
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EPIPE) || errors.As(err, &ne)
}
