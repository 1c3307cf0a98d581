package stock

import "github.com/stockres/stock/internal/engine"

// ErrRegistryLost is returned (joined with any other error) by a reconcile pass that found
// items the Store has, and whose keys Redis has or had, missing from Redis's registry of items
// ("<prefix>:items"): Redis lost data (a restart without persistence, FLUSHALL, a deleted
// key). Nothing that walks the registry (relays, passes, sweeps, the failover guard) saw those items.
// A repairing pass has registered them again, and rebuilt from the Store those whose keys were
// gone too; the reports say which (stockops.Report.Unregistered). Sales Redis acknowledged and had not
// yet delivered to the Store were lost with it: a human must look.
var ErrRegistryLost = engine.ErrRegistryLost

// An ItemLister is a Store that can list its items, in pages ordered by SKU (byte-wise, as Go
// compares strings). ListItems returns up to limit SKUs greater than after ("" for the first
// page). A reconciler whose Store is an ItemLister (and a RecordLister) finds the items Redis
// lost from its registry, even when Redis lost everything; with another Store, a pass sees only
// the items the registry still lists.
type ItemLister = engine.ItemLister
