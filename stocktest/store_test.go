package stocktest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockres/stock"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stocktest"
)

// --- TestStore against broken stores, in a child process -----------------------------------

// contractStore is a small Store whose mode breaks one rule of the contract on purpose.
type contractStore struct {
	mode string
	mu   sync.Mutex
	rem  map[string]int64
	recs map[string]map[string]stock.Record
}

func newContractStore(mode string) *contractStore {
	return &contractStore{mode: mode, rem: map[string]int64{}, recs: map[string]map[string]stock.Record{}}
}

func (s *contractStore) Load(_ context.Context, sku string, qty int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.rem[sku]; ok {
		return stock.ErrLoaded
	}
	s.rem[sku] = qty
	return nil
}

func (s *contractStore) Remaining(_ context.Context, sku string) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.rem[sku]
	if !ok {
		if s.mode == "remaining-unknown-zero" {
			return 0, nil
		}
		return 0, stock.ErrNotLoaded
	}
	return n, nil
}

func (s *contractStore) Records(_ context.Context, sku string, ids []string) (map[string]stock.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]stock.Record{}
	for _, id := range ids {
		if r, ok := s.recs[sku][id]; ok {
			out[id] = r
		}
	}
	return out, nil
}

func (s *contractStore) Apply(_ context.Context, ev stock.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	recs := s.recs[ev.SKU]
	if recs == nil {
		recs = map[string]stock.Record{}
		s.recs[ev.SKU] = recs
	}
	rec, seen := recs[ev.ID]
	rem, loaded := s.rem[ev.SKU]
	newRec := func(st stock.State) stock.Record {
		return stock.Record{SKU: ev.SKU, ID: ev.ID, User: ev.User, Type: ev.Type, Qty: ev.Qty, Status: st, At: time.Now()}
	}
	covers := func() bool {
		if s.mode == "negative" {
			return loaded && rem > 0 // checks only that some stock is left
		}
		return loaded && rem >= ev.Qty
	}
	switch ev.Type {
	case stock.EventDeducted, stock.EventConfirmed:
		if s.mode == "repeat-refused-when-low" && !covers() {
			// A conditional decrement first, the id looked up only when it succeeds: a repeat
			// of an applied deduct is "refused" once the stock has dropped below its qty.
			if !seen {
				recs[ev.ID] = newRec(stock.StateRefused)
			}
			return stock.ErrRefused
		}
		if !seen && !loaded {
			return stock.ErrNotLoaded // a setup error, not a refusal: nothing recorded
		}
		if seen && s.mode != "non-idempotent" {
			if rec.Status == stock.StateRefused {
				if s.mode == "refusal-not-sticky" && covers() {
					s.rem[ev.SKU] = rem - ev.Qty
					recs[ev.ID] = newRec(stock.StateApplied)
					return nil
				}
				return stock.ErrRefused
			}
			if rec.Status == stock.StateRestored && s.mode == "tombstone-ignored" && covers() {
				s.rem[ev.SKU] = rem - ev.Qty
				recs[ev.ID] = newRec(stock.StateApplied)
			}
			return nil
		}
		if !covers() {
			recs[ev.ID] = newRec(stock.StateRefused)
			return stock.ErrRefused
		}
		s.rem[ev.SKU] = rem - ev.Qty
		recs[ev.ID] = newRec(stock.StateApplied)
	case stock.EventRestored, stock.EventRefused:
		if !seen {
			if s.mode != "tombstone-ignored" {
				recs[ev.ID] = newRec(stock.StateRestored)
			}
			return nil
		}
		if rec.Status == stock.StateApplied && rec.Type != stock.EventRestocked {
			if s.mode == "racy-restore" {
				// Check, then give back outside the lock (a read-then-write without a row lock).
				s.mu.Unlock()
				time.Sleep(2 * time.Millisecond)
				s.mu.Lock()
				s.rem[ev.SKU] += rec.Qty
				rec.Status = stock.StateRestored
				s.recs[ev.SKU][ev.ID] = rec
				return nil
			}
			s.rem[ev.SKU] = rem + rec.Qty
			rec.Status = stock.StateRestored
			recs[ev.ID] = rec
		}
	case stock.EventRestocked:
		if seen {
			return nil
		}
		if !loaded {
			return stock.ErrNotLoaded
		}
		s.rem[ev.SKU] = rem + ev.Qty
		recs[ev.ID] = newRec(stock.StateApplied)
	}
	return nil
}

// TestStoreSuiteChild runs stocktest.TestStore on the store STOCKTEST_CHILD_STORE names; it is
// run by TestStoreSuiteOnStores in a child process, and skips otherwise.
func TestStoreSuiteChild(t *testing.T) {
	mode := os.Getenv("STOCKTEST_CHILD_STORE")
	if mode == "" {
		t.Skip("run by TestStoreSuiteOnStores in a child process")
	}
	stocktest.TestStore(t, func(t *testing.T) stock.Store {
		if mode == "memstore" {
			return memstore.New()
		}
		return newContractStore(mode)
	})
}

// suiteChild runs test (TestStoreSuiteChild or TestPublisherSuiteChild) in a child test
// process with env=mode, within limit, and reports whether it failed, with its output.
func suiteChild(t *testing.T, test, env, mode string, limit time.Duration) (failed bool, out string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+test+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), env+"="+mode)
	b, err := cmd.CombinedOutput()
	out = string(b)
	if ctx.Err() != nil {
		t.Fatalf("child for %s timed out:\n%s", mode, tail(out, 40))
	}
	if strings.Contains(out, "panic:") || strings.Contains(out, "no tests to run") {
		t.Fatalf("child for %s did not run the suite cleanly:\n%s", mode, tail(out, 60))
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("child for %s: %v", mode, err)
	}
	return err != nil, out
}

// TestStoreSuiteOnStores runs stocktest.TestStore, in a child process each, on memstore and a
// correct contractStore, which must pass it (the named subtests included), and on stores that
// break the contract on purpose, which must fail it: in the named subtest where one is given.
// The last two break it in ways TestStore's doc says it checks but that no single subtest
// names: "Apply is idempotent per (SKU, ID), and a repeat answers as the first application
// did" (a repeat of an applied deduct answered ErrRefused once stock dropped below its qty:
// the relay would give the units back in Redis for a sale the store keeps) and "concurrent
// applies of one id apply it once" (concurrent duplicate restores of one id give back twice).
func TestStoreSuiteOnStores(t *testing.T) {
	cases := []struct {
		mode     string
		pass     bool
		subtests []string // that must pass, or (one) fail
	}{
		{"memstore", true, []string{"DeductIdempotent", "RefusalIsFinal", "ConcurrentNoOversell", "Batch", "BatchStopsAtFailure", "BatchAnswersUnapplied"}},
		{"correct", true, nil},
		{"non-idempotent", false, []string{"DeductIdempotent"}},
		{"negative", false, []string{"RefusalIsFinal"}},
		{"tombstone-ignored", false, []string{"RestoreBeforeDeductTombstone"}},
		{"refusal-not-sticky", false, []string{"RefusalIsFinal"}},
		{"remaining-unknown-zero", false, []string{"RemainingUnknownItem"}},
		{"repeat-refused-when-low", false, nil},
		{"racy-restore", false, nil},
	}
	for _, tc := range cases {
		t.Run(tc.mode, func(t *testing.T) {
			failed, out := suiteChild(t, "TestStoreSuiteChild", "STOCKTEST_CHILD_STORE", tc.mode, 3*time.Minute)
			if tc.pass {
				if failed {
					t.Fatalf("TestStore fails %s:\n%s", tc.mode, out)
				}
				for _, sub := range tc.subtests {
					if !strings.Contains(out, "--- PASS: TestStoreSuiteChild/"+sub+" ") {
						t.Fatalf("subtest %s did not pass on %s:\n%s", sub, tc.mode, out)
					}
				}
				return
			}
			if !failed {
				t.Fatalf("TestStore passed a store broken on purpose (%s); a store with this bug is certified:\n%s", tc.mode, tail(out, 40))
			}
			for _, sub := range tc.subtests {
				if !strings.Contains(out, "--- FAIL: TestStoreSuiteChild/"+sub+" ") {
					t.Fatalf("broken store %s: subtest %s did not fail:\n%s", tc.mode, sub, out)
				}
			}
		})
	}
}

// TestSubtleStoresReallyBroken shows directly that the repeat-refused-when-low and racy-restore
// stores break the contract, so that TestStoreSuiteOnStores failing them is right.
func TestSubtleStoresReallyBroken(t *testing.T) {
	ctx := context.Background()
	t.Run("repeat-refused-when-low", func(t *testing.T) {
		s := newContractStore("repeat-refused-when-low")
		_ = s.Load(ctx, "a", 3)
		e := stock.Event{Type: stock.EventDeducted, SKU: "a", ID: "o1", Qty: 3}
		if err := s.Apply(ctx, e); err != nil {
			t.Fatal(err)
		}
		if err := s.Apply(ctx, e); !errors.Is(err, stock.ErrRefused) {
			t.Fatalf("the broken store answered the repeat %v (expected it to be broken)", err)
		}
		if r, _ := s.Records(ctx, "a", []string{"o1"}); r["o1"].Status != stock.StateApplied {
			t.Fatalf("record %+v", r)
		}
		t.Logf("repeat of an applied deduct answered ErrRefused while its record says applied: contract broken")
	})
	t.Run("racy-restore", func(t *testing.T) {
		s := newContractStore("racy-restore")
		_ = s.Load(ctx, "a", 10)
		_ = s.Apply(ctx, stock.Event{Type: stock.EventDeducted, SKU: "a", ID: "o1", Qty: 3})
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = s.Apply(ctx, stock.Event{Type: stock.EventRestored, SKU: "a", ID: "o1", Qty: 3})
			}()
		}
		wg.Wait()
		if n, _ := s.Remaining(ctx, "a"); n == 10 {
			t.Fatalf("the racy store gave back once (remaining 10); expected it to be broken")
		} else {
			t.Logf("8 concurrent restores of one id: remaining %d, want 10: contract broken", n)
		}
	})
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
