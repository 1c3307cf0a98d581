package stock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/memstore"
	"github.com/stretchr/testify/assert"
)

// TestRunOptionsValidate: Validate answers what Run answers at once, for options Run refuses
// (an ErrInvalid, before anything runs) and for options it accepts (nil, where Run runs until
// its context ends).
func TestRunOptionsValidate(t *testing.T) {
	_, c := redistest.Miniredis(t)
	r := newReserver(t, c)
	db := memstore.New()
	pub := stock.PublisherFunc(func(context.Context, stock.Event) error { return nil })
	for _, tc := range []struct {
		name    string
		opts    stock.RunOptions
		invalid bool
	}{
		{"zero", stock.RunOptions{}, false},
		{"store", stock.RunOptions{Store: db}, false},
		{"store, every option", stock.RunOptions{Store: db, Publisher: pub,
			Relay:     &stock.RelayOptions{Items: []string{"a"}, Batch: 10, Lease: time.Second, Poll: time.Millisecond},
			Reconcile: &stock.ReconcileOptions{Items: []string{"a"}, Retention: -1, Interval: -1}}, false},
		{"relay batch", stock.RunOptions{Store: db, Relay: &stock.RelayOptions{Batch: 10001}}, true},
		{"relay poll", stock.RunOptions{Publisher: pub, Relay: &stock.RelayOptions{Poll: -1}}, true},
		{"relay backoff", stock.RunOptions{Store: db, Relay: &stock.RelayOptions{MinBackoff: time.Second, MaxBackoff: time.Millisecond}}, true},
		{"relay item", stock.RunOptions{Store: db, Relay: &stock.RelayOptions{Items: []string{"a{b}"}}}, true},
		{"repair limit", stock.RunOptions{Store: db, Reconcile: &stock.ReconcileOptions{RepairLimit: -1}}, true},
		{"reconcile item", stock.RunOptions{Store: db, Reconcile: &stock.ReconcileOptions{Items: []string{""}}}, true},
		// Run makes no reconciler without a Store, so it reads no reconcile option; nor relay
		// options without a Store or a Publisher.
		{"reconcile options without a store", stock.RunOptions{Publisher: pub, Reconcile: &stock.ReconcileOptions{RepairLimit: -1}}, false},
		{"relay options without a relay", stock.RunOptions{Relay: &stock.RelayOptions{Batch: -1}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			verr := tc.opts.Validate()
			ctx, cancel := context.WithCancel(context.Background())
			if !tc.invalid {
				cancel() // a valid Run lasts until its context ends
			}
			rerr := r.Run(ctx, tc.opts)
			cancel()
			if tc.invalid {
				assert.ErrorIs(t, verr, stock.ErrInvalid)
				assert.ErrorIs(t, rerr, stock.ErrInvalid)
				assert.Equal(t, verr.Error(), rerr.Error(), "Validate and Run give the same error")
			} else {
				assert.NoError(t, verr)
				assert.True(t, errors.Is(rerr, context.Canceled) && !errors.Is(rerr, stock.ErrInvalid), "Run accepted the options: %v", rerr)
			}
		})
	}
}
