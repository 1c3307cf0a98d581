// Package engine is what package stock runs: its Reserver does the work of stock.Reserver,
// whose methods call it one for one. Package stock documents the behaviour; the comments here
// say how it is done.
//
// Where to start: stock.go (Load, Deduct, Restore and the receipt of a script's answer),
// hold.go and cart.go (holds and carts), bucket.go, bucketorder.go and bucketretire.go (items
// split over buckets: routing and transfers, the order of their events across buckets,
// retiring them), fastpath.go (the sold-out filter), relay.go and run.go (delivery to the Store and
// Publisher, Run's loops), reconcile.go, registry.go and guard.go (the reconciler, the registry
// of items and the failover guard). The scripts are in lua/, their keys and reply formats in
// internal/protocol; internal/lane coalesces script calls, internal/bounded bounds commands,
// internal/hints collects the due-work hints a call leaves.
//
// Package stockops reaches the operations it runs by hand (operations.go) through Of.
package engine
