package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stockres/stock/internal/bounded"
	"github.com/stockres/stock/internal/errs"
)

// The memory policy check.
//
// Every key of this package is load-bearing: an evicted ledger entry lets a repeat of an
// acknowledged request id sell again, an evicted buyers' hash lets a buyer past the limit, an
// evicted lease lets two relays or passes work on one item. A Redis whose maxmemory-policy is not
// noeviction may evict any of them (the allkeys-* policies any key, the volatile-* ones the keys
// with a TTL, which include the leases and the ack marks), so a Reserver refuses to write on one
// unless WithEvictionAllowed says the user knows.
//
// New takes no context and must work while Redis is down, so the check runs on first use: the
// first write of a Reserver (and Run, before it starts anything) reads CONFIG GET maxmemory-policy
// from every node the client knows, once, within WithTimeout's bound. Concurrent first writes
// share one check. A check that a transport error cut short decided nothing: the write that
// waited for it returns that error (nothing was written) and the next write checks again. A
// safe policy, an allowed one or a server that hides its config (CONFIG renamed or denied by an
// ACL, miniredis) is final: from then on a write costs one atomic load. A refusal is checked
// again by the write that finds it, at most once per policyRecheck, so a Redis set to
// noeviction afterwards lets the Reserver write again without a restart. A reconcile pass checks
// afresh (evictionReport), so a policy turned evicting after start-up refuses the writes too.

// ErrEvictionPolicy is stock.ErrEvictionPolicy, documented there: checkEviction's answer, as
// above, while a node's maxmemory-policy can evict keys.
var ErrEvictionPolicy = errs.ErrEvictionPolicy

// policyRecheck is how often, at most, a refused Reserver's writes check the policy again.
const policyRecheck = time.Second

// policyGuard is a Reserver's memory policy check (see above).
type policyGuard struct {
	ok atomic.Bool // a check found the policy safe, allowed, or hidden: writes go on

	mu      sync.Mutex
	refused error       // the refusal of the last check (ErrEvictionPolicy), or nil
	at      time.Time   // when refused was found
	call    *policyCall // the check in flight, which every write that needs it waits for
	hidden  bool        // the hidden config was logged
	allowed bool        // the allowed evicting policy was logged
	evicted map[string]int64
}

// policyCall is one check, shared by the writes that wait for it.
type policyCall struct {
	done chan struct{}
	err  error // nil, ErrEvictionPolicy, or the transport error that cut the check short
}

// checkEviction returns nil when r may write, ErrEvictionPolicy when Redis may evict its keys,
// or the error that kept the check from deciding (ErrUnknownOutcome, the caller's context's).
// It costs one atomic load once a check found the policy safe.
func (r *Reserver) checkEviction(ctx context.Context) error {
	p := &r.policy
	if p.ok.Load() {
		return nil
	}
	p.mu.Lock()
	if p.refused != nil && time.Since(p.at) < policyRecheck {
		err := p.refused
		p.mu.Unlock()
		return err
	}
	c := p.call
	if c == nil {
		c = &policyCall{done: make(chan struct{})}
		p.call = c
		// The check is shared: the caller whose write started it may leave before it ends.
		go func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.opts.timeout)
			defer cancel()
			err := r.checkPolicy(cctx)
			p.mu.Lock()
			p.call, c.err = nil, err
			p.mu.Unlock()
			close(c.done)
		}()
	}
	p.mu.Unlock()
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return fmt.Errorf("stock: checking Redis's maxmemory-policy: %w", bounded.UnknownOutcome(ctx, ctx.Err()))
	}
}

// writable checks the names of a give-back (Restore, Cancel, stockops.Refuse), then the policy.
func (r *Reserver) writable(ctx context.Context, sku, id string) error {
	if err := checkSKUID(sku, id); err != nil {
		return err
	}
	return r.checkEviction(ctx)
}

// writableItem checks the name of a call on a whole item (CloseItem, ReopenItem, Delist), then
// the policy.
func (r *Reserver) writableItem(ctx context.Context, sku string) error {
	if err := checkName("sku", sku); err != nil {
		return err
	}
	return r.checkEviction(ctx)
}

// checkPolicy reads every node's maxmemory-policy and records the verdict: nil (safe, allowed, or
// hidden), ErrEvictionPolicy, or a transport error, which records nothing.
func (r *Reserver) checkPolicy(ctx context.Context) error {
	p := &r.policy
	evicting, hidden, err := r.readPolicies(ctx)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(hidden) > 0 && !p.hidden {
		p.hidden = true
		var nodes []string
		for _, addr := range slices.Sorted(maps.Keys(hidden)) {
			nodes = append(nodes, addr+": "+hidden[addr].Error())
		}
		r.opts.logger.WarnContext(ctx, "stock: Redis does not tell its maxmemory-policy (CONFIG GET refused): the check that it cannot evict this package's keys is skipped; make sure the policy is noeviction",
			"nodes", strings.Join(nodes, "; "))
	}
	if len(evicting) == 0 || r.opts.evictionAllowed {
		if len(evicting) > 0 && !p.allowed {
			p.allowed = true
			r.opts.logger.WarnContext(ctx, "stock: REDIS MAY EVICT THIS PACKAGE'S KEYS (WithEvictionAllowed): an evicted ledger entry sells a repeated request id again, an evicted buyers' count lets a buyer past the limit; set maxmemory-policy noeviction",
				"policy", policyList(evicting))
		}
		p.refused = nil
		p.ok.Store(true)
		return nil
	}
	p.refused = fmt.Errorf("%w: %s; a repeat of a sold request id may be sold again and a buyer may pass the limit once Redis evicts their keys. "+
		"Run CONFIG SET maxmemory-policy noeviction (and set it in redis.conf), or accept the risk with stock.WithEvictionAllowed(); nothing was written",
		ErrEvictionPolicy, policyList(evicting))
	p.at = time.Now()
	p.ok.Store(false)
	return p.refused
}

// policyList is "maxmemory-policy is allkeys-lru on 127.0.0.1:6379, …", by address.
func policyList(evicting map[string]string) string {
	var parts []string
	for _, addr := range slices.Sorted(maps.Keys(evicting)) {
		parts = append(parts, fmt.Sprintf("maxmemory-policy is %s on %s", evicting[addr], addr))
	}
	return strings.Join(parts, ", ")
}

// readPolicies reads CONFIG GET maxmemory-policy from every node of the client (a cluster's
// primaries and the replicas it knows, a Sentinel deployment's primary): the nodes whose policy
// is not noeviction, with it, and those that hide it (an error reply: CONFIG renamed, denied by
// an ACL, unknown to the server; or a reply without the setting), with why. A transport error
// decides nothing and is returned.
func (r *Reserver) readPolicies(ctx context.Context) (evicting map[string]string, hidden map[string]error, err error) {
	evicting, hidden = map[string]string{}, map[string]error{}
	for addr, node := range r.client.Nodes() {
		m, err := node.Do(ctx, node.B().ConfigGet().Parameter("maxmemory-policy").Build()).AsStrMap()
		switch {
		case err != nil && isRedisErr(err):
			hidden[addr] = err
		case err != nil && errors.Is(err, ErrUnknownOutcome):
			return nil, nil, fmt.Errorf("stock: checking Redis's maxmemory-policy on %s: %w", addr, err)
		case err != nil:
			hidden[addr] = err // a reply not understood
		case m["maxmemory-policy"] == "":
			hidden[addr] = errors.New("CONFIG GET maxmemory-policy answered nothing")
		case m["maxmemory-policy"] != "noeviction":
			evicting[addr] = m["maxmemory-policy"]
		}
	}
	return evicting, hidden, nil
}

// evictionReport is what a reconcile pass reports of evictions, for a human ("" if nothing):
// a policy that can evict (checked afresh, so a policy turned evicting since start-up refuses
// the writes from now on), and keys Redis evicted (INFO stats evicted_keys) since this Reserver
// last looked, or since Redis started for its first look. It logs what it reports as an error.
// Errors reading Redis are left to the rest of the pass.
func (rc *Reconciler) evictionReport(ctx context.Context) string {
	r := rc.r
	var why []string
	if err := r.checkPolicy(ctx); errors.Is(err, ErrEvictionPolicy) {
		why = append(why, "Redis may evict keys ("+strings.TrimPrefix(err.Error(), ErrEvictionPolicy.Error()+": ")+")")
	}
	var lost []string
	p := &r.policy
	for addr, node := range r.client.Nodes() {
		info, err := node.Do(ctx, node.B().Info().Section("stats").Build()).ToString()
		if err != nil {
			continue
		}
		n, err := strconv.ParseInt(infoFields(info, "evicted_keys")["evicted_keys"], 10, 64)
		if err != nil || n <= 0 {
			continue
		}
		p.mu.Lock()
		if p.evicted == nil {
			p.evicted = map[string]int64{}
		}
		seen, ok := p.evicted[addr]
		if n < seen { // a restart or CONFIG RESETSTAT
			seen, ok = 0, false
		}
		p.evicted[addr] = n
		p.mu.Unlock()
		if n > seen {
			what := "since it started"
			if ok {
				what = "since the last pass"
			}
			lost = append(lost, fmt.Sprintf("%s evicted %d keys %s", addr, n-seen, what))
		}
	}
	if len(lost) > 0 {
		slices.Sort(lost)
		why = append(why, "Redis evicted keys (INFO stats evicted_keys: "+strings.Join(lost, ", ")+
			"): idempotency records (ledger entries) and per-user counts may be lost, so a repeated request id may have sold again and a buyer may have passed the limit; "+
			"check the Store's sales, set maxmemory-policy noeviction, and CONFIG RESETSTAT once done")
	}
	if len(why) == 0 {
		return ""
	}
	s := strings.Join(why, "; ")
	r.opts.logger.ErrorContext(ctx, "stock: reconcile: NEEDS A HUMAN: "+s)
	return s
}
