package engine

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"unicode"
	"unicode/utf8"

	"github.com/redis/rueidis"
	"github.com/stockres/stock/internal/bounded"
	"github.com/stockres/stock/internal/hints"
	"github.com/stockres/stock/internal/lane"
	"github.com/stockres/stock/internal/protocol"
)

// keyCacheSize bounds the items whose keys a Reserver keeps built (see protocol.KeyCache).
const keyCacheSize = 8192

// Reserver is the engine of stock.Reserver, whose contract is documented there: each method of
// stock.Reserver calls the method of the same name here (stock.go, hold.go, cart.go, ...), and
// package stockops reaches the rest through Of (operations.go).
type Reserver struct {
	client    rueidis.Client
	opts      options
	limitArg  string                        // opts.userLimit, formatted once
	deducts   lane.Lanes[Request, outcome]  // the coalescing of deducts, per item
	claims    lane.Lanes[claimReq, string]  // the coalescing of claims (route), per claims hash
	guarded   atomic.Bool                   // a failover guard exists: a pass that cannot record the epoch fails
	fenced    atomic.Bool                   // a failover guard saw the primaries change: ErrFailover
	guard     atomic.Pointer[FailoverGuard] // the latest guard, which a pass that records the epoch checks
	rechecked atomic.Int64                  // when a fenced request last checked the guard (unix ns); see isFenced
	soldOut   *soldOut                      // the sold-out fast path; nil when off
	keyCache  *protocol.KeyCache
	hints     *hints.Collector // the due-work hints of the background loops (hints.go)
	running   atomic.Bool      // a Run runs: another is refused with ErrRunning

	calls     bounded.Gate  // the calls in flight (Close waits for them)
	cmds      *bounded.Gate // the Redis commands in flight, counted by the bounded client; nil without New
	runMu     sync.Mutex
	closing   bool                             // Close began; runMu
	runs      map[*int]context.CancelCauseFunc // the Runs in progress, which Close stops; runMu
	closeOnce sync.Once
	closeDone chan struct{} // closed when Close's work is done
	policy    policyGuard   // the memory policy check: eviction.go

	unknownAt sync.Map   // sku -> time.Time of the last log of its events held back (notloaded.go)
	clock     entryClock // Redis's clock, estimated for deduct.lua (clock.go)
}

// checkName checks a name (an item, a request id, a user, a group, the prefix): 1 to MaxNameLen
// bytes of valid UTF-8 without braces, '|', whitespace, control characters or Unicode format
// characters (category Cf: zero-width spaces and joiners, the byte order mark, the soft hyphen,
// bidirectional controls, tag characters), which would make names that look alike and differ.
// Other letters, marks and symbols of any script are accepted; names are compared byte for byte.
func checkName(what, s string) error {
	if s == "" {
		return invalid("empty %s", what)
	}
	if len(s) > MaxNameLen {
		return invalid("%s longer than %d bytes", what, MaxNameLen)
	}
	if !utf8.ValidString(s) {
		return invalid("%s is not valid UTF-8", what)
	}
	for i, c := range s {
		if c == '{' || c == '}' || c == '|' || unicode.IsSpace(c) || unicode.IsControl(c) {
			return invalid("%s %q contains %q (braces, '|', whitespace and control characters are not allowed)", what, s, c)
		}
		if unicode.Is(unicode.Cf, c) {
			return invalid("%s %q contains the invisible format character U+%04X at byte %d (Unicode format characters, such as zero-width spaces and joiners, the byte order mark, the soft hyphen and bidirectional controls, are not allowed)", what, s, c, i)
		}
	}
	return nil
}

// checkSKUs checks every name of skus with checkName.
func checkSKUs(skus []string) error {
	for _, sku := range skus {
		if err := checkName("sku", sku); err != nil {
			return err
		}
	}
	return nil
}

func checkQty(q int64) error {
	if q <= 0 || q > MaxQty {
		return invalid("quantity %d out of range [1, %d]", q, MaxQty)
	}
	return nil
}

func checkRequest(q Request) error {
	if err := checkName("sku", q.SKU); err != nil {
		return err
	}
	if err := checkName("id", q.ID); err != nil {
		return err
	}
	if q.User != "" {
		if err := checkName("user", q.User); err != nil {
			return err
		}
	}
	return checkQty(q.Qty)
}

// base is the common part of an item's keys, in the group WithGroups gives it (protocol.Base);
// for bucket i of an item of n buckets, the base whose slot is in the i-th of n equal ranges of
// the slot space (protocol.BucketBase).
func (r *Reserver) base(sku string) string {
	if parent, i := splitBucket(sku); i >= 0 && bucketName(parent, i) == sku {
		if n := r.bucketsOf(parent); i < n {
			return protocol.BucketBase(r.opts.prefix, parent, i, n)
		}
	}
	return protocol.Base(r.opts.prefix, r.group(sku), sku)
}

// item returns the keys of a valid SKU, built once and cached.
func (r *Reserver) item(sku string) *protocol.Keys {
	if r.keyCache == nil { // a Reserver built without New, in tests
		return protocol.NewKeys(r.base(sku))
	}
	return r.keyCache.Get(sku)
}

func (r *Reserver) group(sku string) string {
	if r.opts.group == nil || strings.IndexByte(sku, '|') >= 0 { // a bucket: its own slot
		return ""
	}
	if g := r.opts.group(sku); checkName("group", g) == nil {
		return g
	}
	return ""
}

func (r *Reserver) registryKey() string {
	return protocol.Registry(r.opts.prefix)
}

func (r *Reserver) outboxFlag() string {
	if r.opts.outbox {
		return "1"
	}
	return "0"
}

// takeWant is what a take of req asks, for conflict.
func takeWant(kind string, req Request) conflictWant {
	return conflictWant{kind: takeKind(kind), qty: req.Qty, user: req.User, checkUser: true}
}
