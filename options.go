package stock

import (
	"log/slog"
)

// An Option configures a Reserver. Options are applied in order by New, which validates them.
type Option func(*options) error

type options struct {
	prefix    string
	userLimit int64
	outbox    bool
	logger    *slog.Logger
	observer  Observer
}

func defaultOptions() options {
	return options{
		prefix: "stock",
		outbox: true,
		logger: slog.New(slog.DiscardHandler),
	}
}

// WithPrefix sets the prefix of every key the Reserver writes. It must be a valid name (no
// braces, whitespace or control characters, at most 128 bytes). The default is "stock".
func WithPrefix(p string) Option {
	return func(o *options) error {
		if err := checkName("prefix", p); err != nil {
			return err
		}
		o.prefix = p
		return nil
	}
}

// WithUserLimit sets the most units one user may hold or have bought of one item at a time
// (restores, cancels and expiries give units back). Requests without a User are not limited.
// 1 is the seeds' one-per-user rule. The default is 0: no limit.
func WithUserLimit(n int64) Option {
	return func(o *options) error {
		if n < 0 || n > MaxQty {
			return invalid("user limit %d out of range [0, %d]", n, MaxQty)
		}
		o.userLimit = n
		return nil
	}
}

// WithOutbox decides whether deducts, restores, restocks and holds queue an event in the item's
// outbox, in the same script that changes the stock. The outbox is what a Relay drains into a
// Store or Publisher; with it off, nothing records that Redis and the database of record must
// agree, and the outbox never grows. Turn it off only when Redis is the only record. The default
// is true.
func WithOutbox(enabled bool) Option {
	return func(o *options) error {
		o.outbox = enabled
		return nil
	}
}

// WithLogger sets the logger for rare events (script reloads, repairs, relay retries). The
// default discards everything.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return invalid("nil logger")
		}
		o.logger = l
		return nil
	}
}
