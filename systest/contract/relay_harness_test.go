package contract_test

import (
	"context"
	"testing"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// The helpers the relay, reconcile, run and fault tests share.

// errOf is the error of a call's two answers.
func errOf(_ any, err error) error { return err }

// newRelay is stockops.NewRelay, failing t if it refuses its arguments.
func newRelay(t testing.TB, r *stock.Reserver, st stock.Store, pub stock.Publisher, o *stock.RelayOptions) *stockops.Relay {
	t.Helper()
	rl, err := stockops.NewRelay(r, st, pub, o)
	require.NoError(t, err)
	return rl
}

// newReconciler is stockops.NewReconciler, failing t if it refuses its arguments.
func newReconciler(t testing.TB, r *stock.Reserver, st stock.Store, o *stock.ReconcileOptions) *stockops.Reconciler {
	t.Helper()
	rc, err := stockops.NewReconciler(r, st, o)
	require.NoError(t, err)
	return rc
}

// remaining is the store's remaining stock of sku, failing t on an error.
func remaining(t testing.TB, st stock.Store, sku string) int64 {
	t.Helper()
	n, err := st.Remaining(context.Background(), sku)
	require.NoError(t, err, "store Remaining %s", sku)
	return n
}

// withStore is a Reserver on c (with opts) and a new memstore, each of skus loaded in both with
// qty units.
func withStore(t *testing.T, c rueidis.Client, qty int64, skus []string, opts ...stock.Option) (*stock.Reserver, *memstore.Store) {
	t.Helper()
	r := testkit.NewReserver(t, c, opts...)
	st := memstore.New()
	for _, sku := range skus {
		loadBoth(t, r, st, sku, qty)
	}
	return r, st
}
