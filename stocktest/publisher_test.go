package stocktest_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stockres/stock/stocktest"
)

// TestPublisherSuiteChild runs stocktest.TestPublisher on the in-memory queue
// STOCKTEST_CHILD_QUEUE names (correct, or broken for the check it names); it is run by
// TestPublisherSuiteOnQueues in a child process, and skips otherwise.
func TestPublisherSuiteChild(t *testing.T) {
	mode := os.Getenv("STOCKTEST_CHILD_QUEUE")
	if mode == "" {
		t.Skip("run by TestPublisherSuiteOnQueues in a child process")
	}
	stocktest.TestPublisher(t, func(t *testing.T) stocktest.PublisherPair { return stocktest.MemQueuePair(t, mode) })
}

// TestPublisherSuiteOnQueues: stocktest.TestPublisher passes a correct in-memory queue and
// fails, in the named subtest, queues broken on purpose (the broken ones only outside -short).
func TestPublisherSuiteOnQueues(t *testing.T) {
	t.Run("correct", func(t *testing.T) {
		t.Parallel()
		if failed, out := suiteChild(t, "TestPublisherSuiteChild", "STOCKTEST_CHILD_QUEUE", "correct", 4*time.Minute); failed {
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
			failed, out := suiteChild(t, "TestPublisherSuiteChild", "STOCKTEST_CHILD_QUEUE", mode, 4*time.Minute)
			if !failed {
				t.Fatalf("TestPublisher passed a queue broken on purpose (%s):\n%s", mode, tail(out, 40))
			}
			if !strings.Contains(out, "--- FAIL: TestPublisherSuiteChild/"+mode+" ") {
				t.Fatalf("queue broken for %s: the subtest did not fail:\n%s", mode, tail(out, 60))
			}
		})
	}
}
