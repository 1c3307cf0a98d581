package stocktest_test

// stocktest.TestStore and stocktest.TestPublisher run as a user runs them: on memstore and
// in-memory queues, and in child processes on stores and queues broken on purpose, which must
// fail them in the named subtests.

import (
	"context"
	"errors"
	"fmt"
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

// TestSuiteChild runs, in the child process suiteChild starts, stocktest.TestStore on the store
// STOCKTEST_CHILD_STORE names (memstore, or a stocktest.BrokenStore), or stocktest.TestPublisher
// on the in-memory queue STOCKTEST_CHILD_QUEUE names (correct, or broken for the check it
// names); it skips otherwise.
func TestSuiteChild(t *testing.T) {
	if mode := os.Getenv("STOCKTEST_CHILD_STORE"); mode == "memstore" {
		stocktest.TestStore(t, func(*testing.T) stock.Store { return memstore.New() })
	} else if mode != "" {
		stocktest.TestStore(t, func(*testing.T) stock.Store { return stocktest.BrokenStore(mode) })
	} else if mode := os.Getenv("STOCKTEST_CHILD_QUEUE"); mode != "" {
		stocktest.TestPublisher(t, func(t *testing.T) stocktest.PublisherPair { return stocktest.MemQueuePair(t, mode) })
	} else {
		t.Skip("run by TestStoreSuiteOnStores and TestPublisherSuiteOnQueues in a child process")
	}
}

// suiteChild runs TestSuiteChild in a child test process with env=mode, within limit, and
// reports whether it failed, with its output.
func suiteChild(t *testing.T, env, mode string, limit time.Duration) (failed bool, out string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSuiteChild$", "-test.v", "-test.count=1")
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
// correct hooked store, which must pass it (the named subtests included), and on stores that
// break the contract on purpose, which must fail it in the named subtest: a store that does not
// apply a repeated deduct once, one that oversells what is left, one that ignores a restore's
// tombstone, one that takes a refused id later, one that answers 0 for an unknown item, one
// that refuses a repeat of an applied deduct once stock is low (the relay would give the units
// back in Redis for a sale the store keeps), and one whose concurrent restores of one id give
// back twice.
func TestStoreSuiteOnStores(t *testing.T) {
	cases := []struct {
		mode     string
		pass     bool
		subtests []string // that must pass, or (one) fail
	}{
		{"memstore", true, []string{"DeductIdempotent", "RefusalIsFinal", "ConcurrentNoOversell", "Batch", "BatchStopsAtFailure", "BatchAnswersUnapplied"}},
		{"good", true, nil},
		{"DeductIdempotent", false, []string{"DeductIdempotent"}},
		{"Oversells", false, []string{"RefusalIsFinal"}},
		{"RestoreBeforeDeductTombstone", false, []string{"RestoreBeforeDeductTombstone"}},
		{"RefusalIsFinal", false, []string{"RefusalIsFinal"}},
		{"RemainingUnknownItem", false, []string{"RemainingUnknownItem"}},
		{"RepeatAppliedWhenLow", false, []string{"RepeatAppliedWhenLow"}},
		{"ConcurrentGiveBackOnce", false, []string{"ConcurrentGiveBackOnce"}},
	}
	for _, tc := range cases {
		t.Run(tc.mode, func(t *testing.T) {
			failed, out := suiteChild(t, "STOCKTEST_CHILD_STORE", tc.mode, 3*time.Minute)
			if tc.pass {
				if failed {
					t.Fatalf("TestStore fails %s:\n%s", tc.mode, out)
				}
				for _, sub := range tc.subtests {
					if !strings.Contains(out, "--- PASS: TestSuiteChild/"+sub+" ") {
						t.Fatalf("subtest %s did not pass on %s:\n%s", sub, tc.mode, out)
					}
				}
				return
			}
			if !failed {
				t.Fatalf("TestStore passed a store broken on purpose (%s); a store with this bug is certified:\n%s", tc.mode, tail(out, 40))
			}
			for _, sub := range tc.subtests {
				if !strings.Contains(out, "--- FAIL: TestSuiteChild/"+sub+" ") {
					t.Fatalf("broken store %s: subtest %s did not fail:\n%s", tc.mode, sub, out)
				}
			}
		})
	}
}

// TestSubtleStoresReallyBroken shows directly that the RepeatAppliedWhenLow and
// ConcurrentGiveBackOnce stores break the contract, so that TestStoreSuiteOnStores failing them
// is right.
func TestSubtleStoresReallyBroken(t *testing.T) {
	ctx := context.Background()
	t.Run("RepeatAppliedWhenLow", func(t *testing.T) {
		s := stocktest.BrokenStore("RepeatAppliedWhenLow")
		_ = s.(stocktest.Loader).Load(ctx, "a", 3)
		e := stock.Event{Type: stock.EventDeducted, SKU: "a", ID: "o1", Qty: 3}
		must(t, s.Apply(ctx, e))
		if err := s.Apply(ctx, e); !errors.Is(err, stock.ErrRefused) {
			t.Fatalf("the broken store answered the repeat %v (expected it to be broken)", err)
		}
		if r, _ := s.Records(ctx, "a", []string{"o1"}); r["o1"].Status != stock.StateApplied {
			t.Fatalf("record %+v", r)
		}
		t.Logf("repeat of an applied deduct answered ErrRefused while its record says applied: contract broken")
	})
	t.Run("ConcurrentGiveBackOnce", func(t *testing.T) {
		s := stocktest.BrokenStore("ConcurrentGiveBackOnce")
		_ = s.(stocktest.Loader).Load(ctx, "a", 10)
		_ = s.Apply(ctx, stock.Event{Type: stock.EventDeducted, SKU: "a", ID: "o1", Qty: 3})
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() { _ = s.Apply(ctx, stock.Event{Type: stock.EventRestored, SKU: "a", ID: "o1", Qty: 3}) })
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

// ---------------------------------------------------------------------------------------------
// memstore through the suite and the relay.

// TestStoreOnMemstore runs the stock.Store conformance suite on memstore (memstore is in the
// root module, which does not depend on this one).
func TestStoreOnMemstore(t *testing.T) {
	stocktest.TestStore(t, func(*testing.T) stock.Store { return memstore.New() })
}

// TestMemstoreCountsThroughRelay: memstore's Applications through the whole path: two distinct
// events, each applied once by the relay, on names the library accepts ('/' is allowed).
func TestMemstoreCountsThroughRelay(t *testing.T) {
	ctx := context.Background()
	e := stocktest.New(t)
	store := memstore.New()
	for _, sku := range []string{"a/b", "a"} {
		_ = store.Load(ctx, sku, 10)
		load(t, e, sku, 10)
	}
	deduct(t, e, "a/b", "c", 1)
	deduct(t, e, "a", "b/c", 1)
	runUntilEnd(t, e, stock.RunOptions{Store: store, Reconcile: &stock.ReconcileOptions{Interval: -1}})
	waitFor(t, 10*time.Second, "both deducts delivered", func() (bool, string) {
		x, _ := store.Remaining(ctx, "a/b")
		y, _ := store.Remaining(ctx, "a")
		return x == 9 && y == 9, fmt.Sprint(x, y)
	})
	if m := store.MaxApplications(); m != 1 {
		t.Fatalf("memstore.MaxApplications() = %d after the relay applied two distinct events once each (a/b:c and a:b/c), want 1", m)
	}
}

// ---------------------------------------------------------------------------------------------
// TestPublisher against in-memory queues, correct and broken, in a child process.

// TestPublisherSuiteOnQueues: stocktest.TestPublisher passes a correct in-memory queue and
// fails, in the named subtest, queues broken on purpose (the broken ones only outside -short).
func TestPublisherSuiteOnQueues(t *testing.T) {
	t.Run("correct", func(t *testing.T) {
		t.Parallel()
		if failed, out := suiteChild(t, "STOCKTEST_CHILD_QUEUE", "correct", 4*time.Minute); failed {
			t.Fatalf("TestPublisher fails a correct in-memory queue:\n%s", tail(out, 60))
		}
	})
	// A queue that drops events, one that loses a crashed member's messages, one that delivers
	// acknowledged messages again: each fails the check named.
	for _, mode := range []string{"AtLeastOnce", "OrderAfterCrash", "ExactlyOnceInEffect"} {
		t.Run(mode, func(t *testing.T) {
			if testing.Short() {
				t.Skip("-short: a broken queue's child run waits out TestPublisher's timeouts (up to half a minute); TestPublisherChecksCanFail makes the same checks fail in-process, and the full tier runs this")
			}
			t.Parallel()
			failed, out := suiteChild(t, "STOCKTEST_CHILD_QUEUE", mode, 4*time.Minute)
			if !failed {
				t.Fatalf("TestPublisher passed a queue broken on purpose (%s):\n%s", mode, tail(out, 40))
			}
			if !strings.Contains(out, "--- FAIL: TestSuiteChild/"+mode+" ") {
				t.Fatalf("queue broken for %s: the subtest did not fail:\n%s", mode, tail(out, 60))
			}
		})
	}
}
