package stock

import "github.com/stockres/stock/stocktype"

// ReconcileOptions configures a reconciler (Reserver.Run's, or stockops.NewReconciler's). A zero
// field takes its default; nil options take every default. It lives in this package, not in
// stockops, because RunOptions.Reconcile carries it.
// Its fields are documented in [stocktype.ReconcileOptions].
type ReconcileOptions = stocktype.ReconcileOptions
