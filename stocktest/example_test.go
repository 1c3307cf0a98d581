package stocktest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stockres/stock"
	"github.com/stockres/stock/stocktest"
)

// A test of code that holds stock: the hold's deadline passes when the test moves the clock,
// not when the machine gets to it.
func Example() {
	t := newExampleT() // in a test, the *testing.T
	defer t.cleanup()

	ctx := context.Background()
	e := stocktest.New(t)
	r := e.Reserver
	if err := r.Load(ctx, "tshirt", 3); err != nil {
		t.Fatalf("Load: %v", err)
	}
	hold := stock.Request{SKU: "tshirt", ID: "cart-1", Qty: 2}
	if _, err := r.Hold(ctx, hold, 15*time.Minute); err != nil {
		t.Fatalf("Hold: %v", err)
	}
	lv, _ := r.Levels(ctx, "tshirt")
	fmt.Println("available while held:", lv.Available)

	e.Advance(16 * time.Minute) // past the deadline, at once

	_, err := r.Confirm(ctx, "tshirt", "cart-1")
	fmt.Println("confirm after the deadline:", errors.Is(err, stock.ErrExpired))
	lv, _ = r.Levels(ctx, "tshirt")
	fmt.Println("available after expiry:", lv.Available)
	// Output:
	// available while held: 1
	// confirm after the deadline: true
	// available after expiry: 3
}

// exampleT stands in for the *testing.T an Example has not got: it runs the clean-ups
// registered with it and panics on a fatal error.
type exampleT struct {
	testing.TB
	cleanups []func()
}

func newExampleT() *exampleT                          { return &exampleT{} }
func (t *exampleT) Helper()                           {}
func (t *exampleT) Cleanup(f func())                  { t.cleanups = append(t.cleanups, f) }
func (t *exampleT) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (t *exampleT) cleanup() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}
