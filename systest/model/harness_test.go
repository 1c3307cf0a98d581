package model_test

import (
	"context"
	"errors"
	"flag"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// The harness the tests of this package share: what a test needs of a *testing.T or a *rapid.T,
// the store and the relay-reconciler pipeline that sequences reconcile with, flags, calls run at
// once, and the levels and ledger checks. The sequences' own harness (type harness) is in
// model_test.go, beside the model's steps.

// TestMain runs the package's tests with the real servers redistest starts when asked.
func TestMain(m *testing.M) { os.Exit(redistest.Run(m)) }

// tb is what the harness needs of a *testing.T or a *rapid.T (require takes it too).
type tb interface {
	Helper()
	Cleanup(f func())
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	FailNow()
	Logf(format string, args ...any)
}

// loadBoth loads sku with n units in Redis and in the store.
func loadBoth(t tb, r *stock.Reserver, store interface {
	Load(ctx context.Context, sku string, n int64) error
}, sku string, n int64) {
	t.Helper()
	require.NoError(t, r.Load(context.Background(), sku, n))
	require.NoError(t, store.Load(context.Background(), sku, n))
}

// pipeline returns a relay of r's events to store and a reconciler of the two; nil relay options
// retry within milliseconds.
func pipeline(t tb, r *stock.Reserver, store stock.Store, ro *stock.RelayOptions, co *stock.ReconcileOptions) (*stockops.Relay, *stockops.Reconciler) {
	t.Helper()
	if ro == nil {
		ro = &stock.RelayOptions{MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond}
	}
	relay, err := stockops.NewRelay(r, store, nil, ro)
	require.NoError(t, err)
	rec, err := stockops.NewReconciler(r, store, co)
	require.NoError(t, err)
	return relay, rec
}

// setFlag sets a flag for the rest of t.
func setFlag(t *testing.T, name, value string) {
	f := flag.Lookup(name)
	if f == nil {
		t.Fatalf("flag %s is not registered", name)
	}
	old := f.Value.String()
	require.NoError(t, f.Value.Set(value))
	t.Cleanup(func() { _ = f.Value.Set(old) })
}

// Errors of testStore's injected failures.
var (
	errPropAfterApply = errors.New("prop: applied, then the connection broke")
	errPropNotApplied = errors.New("prop: not applied after an earlier failure")
)

// testStore is a memstore.Store whose Apply can be told to fail: before applying (the database
// is down) or after applying (the commit happened, the answer was lost). It keeps memstore's
// RecordLister and BatchStore. Given a clock (now), its records carry that clock's time of when
// they were first written (memstore stamps them with the process's clock, which a miniredis run
// does not move), so that the reconciler compares them with the same clock as the ledger's.
type testStore struct {
	*memstore.Store
	mu     sync.Mutex
	okLeft int  // Apply calls that still succeed; < 0: never fail
	after  bool // fail after applying rather than before
	now    func() int64
	at     map[[2]string]int64 // sku, id -> first written, by now
}

// newTestStore returns a store that does not fail, stamping its records with now (nil: memstore's).
func newTestStore(now func() int64) *testStore {
	return &testStore{Store: memstore.New(), okLeft: -1, now: now, at: map[[2]string]int64{}}
}

func (s *testStore) failAfter(okLeft int, after bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.okLeft, s.after = okLeft, after
}

func (s *testStore) Apply(ctx context.Context, ev stock.Event) error {
	s.mu.Lock()
	fail := s.okLeft == 0
	if s.okLeft > 0 {
		s.okLeft--
	}
	after := s.after
	s.mu.Unlock()
	if fail && !after {
		return memstore.ErrDown
	}
	err := s.Store.Apply(ctx, ev)
	if recs, _ := s.Store.Records(ctx, ev.SKU, []string{ev.ID}); s.now != nil && recs[ev.ID].ID != "" {
		s.mu.Lock()
		if k := [2]string{ev.SKU, ev.ID}; s.at[k] == 0 {
			s.at[k] = s.now()
		}
		s.mu.Unlock()
	}
	if fail && err == nil {
		return errPropAfterApply
	}
	return err
}

func (s *testStore) stamp(sku string, r stock.Record) stock.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	if at, ok := s.at[[2]string{sku, r.ID}]; ok {
		r.At = time.UnixMilli(at)
	}
	return r
}

func (s *testStore) Records(ctx context.Context, sku string, ids []string) (map[string]stock.Record, error) {
	m, err := s.Store.Records(ctx, sku, ids)
	for id, r := range m {
		m[id] = s.stamp(sku, r)
	}
	return m, err
}

func (s *testStore) List(ctx context.Context, sku, after string, limit int) ([]stock.Record, error) {
	rs, err := s.Store.List(ctx, sku, after, limit)
	for i, r := range rs {
		rs[i] = s.stamp(sku, r)
	}
	return rs, err
}

// ApplyBatch follows the BatchStore contract: in order, stopping at the first failure that is
// not a refusal.
func (s *testStore) ApplyBatch(ctx context.Context, evs []stock.Event) []error {
	errs := make([]error, len(evs))
	for i, ev := range evs {
		errs[i] = s.Apply(ctx, ev)
		if errs[i] != nil && !errors.Is(errs[i], stock.ErrRefused) {
			for j := i + 1; j < len(evs); j++ {
				errs[j] = errPropNotApplied
			}
			break
		}
	}
	return errs
}

func oneOf(err error, allowed ...error) bool {
	if err == nil {
		return true
	}
	for _, a := range allowed {
		if errors.Is(err, a) {
			return true
		}
	}
	return false
}

// flagSet reports whether the flag was given on the command line.
func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// par runs f(i) for i in [0, n) on n goroutines started together and returns their errors.
func par(n int, f func(i int) error) []error {
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			<-start
			errs[i] = f(i)
		})
	}
	close(start)
	wg.Wait()
	return errs
}

// acked returns the indices of the calls that succeeded, failing t on any error but ErrSoldOut.
func acked(t *testing.T, what string, errs []error) []int {
	t.Helper()
	var ok []int
	for i, err := range errs {
		switch {
		case err == nil:
			ok = append(ok, i)
		case !errors.Is(err, stock.ErrSoldOut):
			t.Fatalf("%s %d: %v", what, i, err)
		}
	}
	return ok
}

func wantLevels(t *testing.T, r *stock.Reserver, sku string, want stock.Levels) {
	t.Helper()
	lv, err := r.Levels(context.Background(), sku)
	if err != nil || lv != want {
		t.Fatalf("Levels(%s) = %+v, %v; want %+v", sku, lv, err, want)
	}
}

// wantEntry checks the ledger entry of id: of kind in one of the states, or absent (no state).
func wantEntry(t *testing.T, r *stock.Reserver, sku, id string, kind stock.Kind, state ...stock.State) {
	t.Helper()
	e, err := r.Ledger(context.Background(), sku, id)
	if len(state) == 0 {
		require.ErrorIs(t, err, stock.ErrUnknownID, "Ledger(%s, %s) = %+v, %v; want none", sku, id, e, err)
		return
	}
	require.NoError(t, err, "Ledger(%s, %s)", sku, id)
	for _, s := range state {
		if e.Kind == kind && e.State == s {
			return
		}
	}
	t.Fatalf("Ledger(%s, %s) = %s %s, want %s %v", sku, id, e.Kind, e.State, kind, state)
}
