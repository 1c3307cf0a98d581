// Package memstore is an in-memory stock.Store for tests and examples. It keeps the same
// records and answers as a database of record would (idempotent Apply, conditional decrement,
// tombstones, refusals), and can be told to fail, so relay and reconciler code can be tested
// without a database. It is safe for concurrent use. Nothing survives the process.
package memstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/stockres/stock"
)

// Store is an in-memory stock.Store, stock.RecordLister, stock.ItemLister and stock.BatchStore.
// The zero value is not usable; call New.
type Store struct {
	mu        sync.Mutex
	remaining map[string]int64
	records   map[string]map[string]stock.Record // sku -> id -> record
	applies   map[applyKey]int                   // times Apply changed something, per event
	fail      func(stock.Event) error
}

// applyKey names one event for Applications: a struct, since SKUs and ids may contain any
// separator a string key could use.
type applyKey struct {
	sku, id string
	typ     stock.EventType
}

// New returns an empty store.
func New() *Store {
	return &Store{remaining: map[string]int64{}, records: map[string]map[string]stock.Record{}, applies: map[applyKey]int{}}
}

// Load creates an item with qty (0 to stock.MaxQty) remaining. It returns an error wrapping
// stock.ErrInvalid if qty is out of that range, and stock.ErrLoaded if the item exists; it
// changes nothing then.
func (s *Store) Load(_ context.Context, sku string, qty int64) error {
	if qty < 0 || qty > stock.MaxQty {
		return fmt.Errorf("%w: load quantity %d out of range [0, %d]", stock.ErrInvalid, qty, stock.MaxQty)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.remaining[sku]; ok {
		return stock.ErrLoaded
	}
	s.remaining[sku] = qty
	return nil
}

// Set overwrites an item's remaining stock, for tests that seed drift.
func (s *Store) Set(sku string, qty int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.remaining[sku] = qty
}

// FailWith makes every later Apply call f first; a non-nil result is returned instead of
// applying the event. nil clears it.
func (s *Store) FailWith(f func(stock.Event) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = f
}

// Remaining implements stock.Store.
func (s *Store) Remaining(_ context.Context, sku string) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.remaining[sku]
	if !ok {
		return 0, stock.ErrNotLoaded
	}
	return n, nil
}

// Apply implements stock.Store.
func (s *Store) Apply(_ context.Context, ev stock.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		if err := s.fail(ev); err != nil {
			return err
		}
	}
	return s.apply(ev)
}

// ApplyBatch implements stock.BatchStore.
func (s *Store) ApplyBatch(ctx context.Context, evs []stock.Event) []error {
	errs := make([]error, len(evs))
	for i, ev := range evs {
		errs[i] = s.Apply(ctx, ev)
		if errs[i] != nil && !errors.Is(errs[i], stock.ErrRefused) {
			for j := i + 1; j < len(evs); j++ {
				errs[j] = fmt.Errorf("memstore: not applied after an earlier failure: %v", errs[i])
			}
			break
		}
	}
	return errs
}

func (s *Store) apply(ev stock.Event) error {
	if ev.SKU == "" || ev.ID == "" || ev.Qty <= 0 || ev.Qty > stock.MaxQty {
		return fmt.Errorf("%w: event %+v", stock.ErrInvalid, ev)
	}
	recs := s.records[ev.SKU]
	if recs == nil {
		recs = map[string]stock.Record{}
		s.records[ev.SKU] = recs
	}
	rec, seen := recs[ev.ID]
	now := time.Now()
	switch ev.Type {
	case stock.EventDeducted, stock.EventConfirmed:
		if seen {
			if rec.Status == stock.StateRefused {
				return stock.ErrRefused
			}
			return nil
		}
		rem, ok := s.remaining[ev.SKU]
		if !ok {
			return stock.ErrNotLoaded // as the Store doc says: not a refusal; the relay retries it later
		}
		rec = stock.Record{SKU: ev.SKU, ID: ev.ID, User: ev.User, Type: ev.Type, Qty: ev.Qty, At: now}
		if rem < ev.Qty {
			rec.Status = stock.StateRefused
			recs[ev.ID] = rec
			return stock.ErrRefused
		}
		s.remaining[ev.SKU] = rem - ev.Qty
		rec.Status = stock.StateApplied
		recs[ev.ID] = rec
		s.applies[applyKey{ev.SKU, ev.ID, ev.Type}]++
	case stock.EventRestored, stock.EventRefused:
		if !seen {
			recs[ev.ID] = stock.Record{SKU: ev.SKU, ID: ev.ID, User: ev.User, Type: ev.Type, Qty: ev.Qty, Status: stock.StateRestored, At: now}
			return nil
		}
		if rec.Status == stock.StateApplied && rec.Type != stock.EventRestocked {
			rec.Status = stock.StateRestored
			recs[ev.ID] = rec
			s.remaining[ev.SKU] += rec.Qty
			s.applies[applyKey{ev.SKU, ev.ID, stock.EventRestored}]++
		}
	case stock.EventRestocked:
		if seen {
			return nil
		}
		if _, ok := s.remaining[ev.SKU]; !ok {
			return stock.ErrNotLoaded // as the Store doc says: the relay retries it later
		}
		recs[ev.ID] = stock.Record{SKU: ev.SKU, ID: ev.ID, Type: ev.Type, Qty: ev.Qty, Status: stock.StateApplied, At: now}
		s.remaining[ev.SKU] += ev.Qty
		s.applies[applyKey{ev.SKU, ev.ID, ev.Type}]++
	case stock.EventHeld, stock.EventCancelled, stock.EventExpired:
	default:
		return fmt.Errorf("%w: event type %q", stock.ErrInvalid, ev.Type)
	}
	return nil
}

// Records implements stock.Store.
func (s *Store) Records(_ context.Context, sku string, ids []string) (map[string]stock.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]stock.Record{}
	for _, id := range ids {
		if r, ok := s.records[sku][id]; ok {
			out[id] = r
		}
	}
	return out, nil
}

// List implements stock.RecordLister.
func (s *Store) List(_ context.Context, sku, after string, limit int) ([]stock.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := slices.Sorted(maps.Keys(s.records[sku]))
	var out []stock.Record
	for _, id := range ids {
		if id > after && len(out) < limit {
			out = append(out, s.records[sku][id])
		}
	}
	return out, nil
}

// Applications returns how many times the event (sku, id, type) changed the stock: 0 or 1 in a
// correct system. Tests use it to find double applications.
func (s *Store) Applications(sku, id string, t stock.EventType) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applies[applyKey{sku, id, t}]
}

// MaxApplications returns the highest count of Applications over all events.
func (s *Store) MaxApplications() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := 0
	for _, n := range s.applies {
		m = max(m, n)
	}
	return m
}

// ErrDown is what a store told to fail with Down returns.
var ErrDown = errors.New("memstore: down")

// Down is a FailWith function that fails every event with ErrDown.
func Down(stock.Event) error { return ErrDown }
