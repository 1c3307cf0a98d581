package engine

import (
	"log/slog"
	"time"
)

// Option is stock.Option, documented there: each sets a field of options.
type Option func(*options) error

type options struct {
	prefix    string
	userLimit int64
	userReq   bool // WithUserRequired
	outbox    bool
	logger    *slog.Logger
	observer  Observer
	inflight  int

	replicas    int
	replicaWait time.Duration

	group func(sku string) string

	buckets func(sku string) int // see WithBuckets

	soldOutTTL time.Duration // 0: no sold-out fast path

	timeout time.Duration // bound of every Redis command; see WithTimeout

	now      func() time.Time // the clock of cutoffs computed in the process; see WithClock
	clockSet bool             // WithClock was given

	evictionAllowed bool // see WithEvictionAllowed
}

func defaultOptions() options {
	return options{
		prefix:     "stock",
		outbox:     true,
		inflight:   4,
		soldOutTTL: time.Second,
		timeout:    DefaultTimeout,
		logger:     slog.Default(),
		now:        time.Now,
	}
}

// WithPrefix is stock.WithPrefix.
func WithPrefix(p string) Option {
	return func(o *options) error {
		if err := checkName("prefix", p); err != nil {
			return err
		}
		o.prefix = p
		return nil
	}
}

// WithClock is stock.WithClock.
func WithClock(now func() time.Time) Option {
	return func(o *options) error {
		if now == nil {
			return invalid("nil clock")
		}
		if o.clockSet {
			return invalid("WithClock given twice: a Reserver has one clock")
		}
		o.now, o.clockSet = now, true
		return nil
	}
}

// WithEvictionAllowed is stock.WithEvictionAllowed.
func WithEvictionAllowed() Option {
	return func(o *options) error {
		o.evictionAllowed = true
		return nil
	}
}

// WithUserLimit is stock.WithUserLimit.
func WithUserLimit(n int64) Option {
	return func(o *options) error {
		if n < 0 || n > MaxQty {
			return invalid("user limit %d out of range [0, %d]", n, MaxQty)
		}
		o.userLimit = n
		return nil
	}
}

// WithUserRequired is stock.WithUserRequired.
func WithUserRequired() Option {
	return func(o *options) error {
		o.userReq = true
		return nil
	}
}

// WithOutbox is stock.WithOutbox.
func WithOutbox(enabled bool) Option {
	return func(o *options) error {
		o.outbox = enabled
		return nil
	}
}

// WithLogger is stock.WithLogger.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return invalid("nil logger")
		}
		o.logger = l
		return nil
	}
}

// WithCoalescing is stock.WithCoalescing.
func WithCoalescing(maxInFlight int) Option {
	return func(o *options) error {
		if maxInFlight < 0 || maxInFlight > 1024 {
			return invalid("coalescing in-flight limit %d out of range [0, 1024]", maxInFlight)
		}
		o.inflight = maxInFlight
		return nil
	}
}

// WithReplicaAck is stock.WithReplicaAck.
func WithReplicaAck(n int, timeout time.Duration) Option {
	return func(o *options) error {
		if n < 0 || n > 100 || (n > 0 && timeout <= 0) {
			return invalid("replica ack %d within %v", n, timeout)
		}
		o.replicas, o.replicaWait = n, timeout
		return nil
	}
}

// WithGroups is stock.WithGroups.
func WithGroups(group func(sku string) string) Option {
	return func(o *options) error {
		if group == nil {
			return invalid("nil group function")
		}
		o.group = group
		return nil
	}
}

// WithBuckets is stock.WithBuckets.
func WithBuckets(buckets func(sku string) int) Option {
	return func(o *options) error {
		if buckets == nil {
			return invalid("nil buckets function")
		}
		o.buckets = buckets
		return nil
	}
}

// WithTimeout is stock.WithTimeout.
func WithTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d < time.Millisecond || d > time.Hour {
			return invalid("timeout %v out of range [1ms, 1h]", d)
		}
		o.timeout = d
		return nil
	}
}

// DefaultTimeout is stock.DefaultTimeout, documented there: the bounded client's bound on every
// command unless WithTimeout sets another.
const DefaultTimeout = 10 * time.Second
