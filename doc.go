// Package stock is atomic stock reservation on Redis for flash sales, ticket drops and limited
// releases: a checkout never sells what it does not have, never takes stock twice for one
// request id, and never loses a sale between Redis and the database of record.
//
// Most callers need a few calls:
//   - [New] makes a [Reserver] on a rueidis client you own; [Reserver.Load] puts an item on
//     sale, once, with the stock the database of record holds.
//   - [Reserver.Deduct] takes stock for a request id, exactly once; [Reserver.Restore] gives
//     it back.
//   - [Reserver.Hold] takes stock until a deadline; [Reserver.Confirm] keeps it,
//     [Reserver.Cancel] gives it back, and a hold not confirmed in time goes back by itself.
//   - [Reserver.DeductMany] and [Reserver.HoldMany] take a cart: every line or none.
//   - [Reserver.Run], in one goroutine, does the background work: it delivers every change to
//     the [Store] (the database of record) and/or a [Publisher], checks Redis against the
//     Store, releases due holds and recovers carts. Read its error: bad [RunOptions] stop it
//     at once ([RunOptions.Validate] checks them first).
//
// The errors a caller handles, with errors.Is: [ErrSoldOut] and [ErrInsufficient] (no stock,
// or less than asked), [ErrUserLimit], [ErrClosed], [ErrFailover] (Redis failed over:
// refused until a reconcile pass), [ErrRestored] (the id was given back, or its restore came first: it takes
// nothing again), [ErrConflict] (the id was used with other parameters), [ErrInvalid] (bad
// input, nothing sent) and [ErrUnknownOutcome]: the call may or may not have run, so retry
// with the same id and Request.Retry set. A cart's refusal is a [*CartError] naming the item.
//
//	r, err := stock.New(client, stock.WithUserLimit(1))
//	err = r.Load(ctx, "sku-1", 100)
//	rc, err := r.Deduct(ctx, stock.Request{SKU: "sku-1", ID: orderID, User: user, Qty: 1})
//	// the order was cancelled: r.Restore(ctx, "sku-1", orderID)
//	go func() {
//		if err := r.Run(ctx, stock.RunOptions{Store: store}); err != nil && ctx.Err() == nil {
//			log.Printf("stock: background work stopped: %v", err)
//		}
//	}()
//
// The examples show each of these on an in-process Redis. The rest of the API serves a shop's
// operations (Restock, Extend, ConfirmMany, CancelMany, CloseItem, ReopenItem, Delist) and
// tuning (the With options); package stockops runs the background work by hand, package
// stocktest helps test code that uses this one, and package memstore is an in-memory Store.
// The data types (Request, Receipt, Levels, Entry, Cart, Event, Store, RunOptions's Relay and
// Reconcile settings, ...) are defined in package stocktype and named here by type aliases,
// which go doc does not follow: `go doc stocktype.Request` lists the fields of stock.Request.
//
// # How it works
//
// Each operation is one Lua script (lua/*.lua, embedded; run as a Redis function, FCALL, where
// the server has functions and the user may call them, else with rueidis: EVALSHA, then EVAL
// when the server lost its script cache) that checks the request id against the item's ledger,
// checks the per-user limit and the stock, takes the stock, writes the ledger entry and queues
// the outbox event, atomically. Run drains the outbox into a Store (the database of record)
// and/or a Publisher (a message queue), compares Redis with the Store, and releases holds past
// their deadline (package stockops runs each of these by hand, for tools and for deployments
// that split them over processes). Every key of an item shares the hash tag {sku} (or {group},
// see WithGroups), so one script touches one Redis Cluster slot; the repository's docs list the
// keys. Names may not contain a brace, nor an invisible format character (see MaxNameLen). A
// hot item can be split over several slots, and so several Redis cores, with WithBuckets.
//
// # Guarantees
//
//   - No oversell: for every item, loaded = available + held + sold at every moment, and
//     available never goes below zero, whatever the number of concurrent callers.
//   - Exactly once per request id: a repeat of an id answers with the original outcome and
//     Replayed set; a repeat with a different item quantity or user is ErrConflict; a restore
//     gives back exactly what its id took, once; a restore of an unknown id takes nothing and
//     leaves a tombstone that refuses the late deduct (ErrRestored).
//   - Nothing lost between Redis and the database: the outbox event is written by the same
//     script as the deduct, and the relay removes it only after the Store applied it and the
//     Publisher accepted it (at least once; the Store is idempotent, so exactly once in
//     effect). With no Store (the queue path) a published event stays in the item's published
//     set until a consumer has applied it through Consume: the reconciler counts it as in
//     flight until then. An event that cannot be delivered (rejected as invalid, or its ledger
//     entry gone) is set aside as a dead letter, never dropped. A deduct the Store refuses is
//     given back in Redis, once.
//   - In order per item: every event carries its place in its item's sequence (Event.Seq), and
//     the Store gets an item's events in that order on both paths: the relay delivers them in
//     sequence, and Consume applies an item's earlier events (from Redis) before the one it was
//     handed, whatever order the queue redelivers in.
//   - Bad input is refused with ErrInvalid before anything is sent to Redis.
//   - Every call is bounded: each Redis command ends after WithTimeout (DefaultTimeout, 10 s)
//     at the latest, rueidis's resends included, even when the caller's context has no
//     deadline. A call that could not learn what happened returns ErrUnknownOutcome.
//
// # Non-guarantees
//
//   - Redis replication is asynchronous: a failover or a restart without persistence can lose
//     acknowledged deducts, ledger entries and outbox events. The database of record then
//     disagrees with Redis until reconciled; the Store's unique (sku, id) still refuses a
//     second application of a replayed id.
//   - ErrUnknownOutcome (Redis unreachable, a broken connection, the time ran out, a reply
//     this package does not understand), or an error that is none of this package's
//     sentinels, leaves the outcome unknown: the script may have run. Retry with the same id
//     and Request.Retry set; the retry is a replay if it did, and a refusal of the retry is
//     recorded so that the first attempt, should it arrive later, is refused too.
//   - A failover guard notices a restarted or replaced primary only when it checks, and
//     WithReplicaAck bounds, but does not remove, what a failover can lose.
//   - Idempotency lasts as long as the ledger entry: entries are kept in Redis until trimmed.
//   - A Store refusal is found after the deduct succeeded: the buyer was told yes, and is told
//     no later (EventRefused).
//   - The sold-out fast path (WithSoldOutCache, on by default with a caching client) answers
//     ErrSoldOut from a cached read: for as long as an invalidation takes to arrive after
//     another process gave stock back (well under a millisecond on a quiet local network), a
//     request can still be told "sold out". It never admits a request, and never refuses an id
//     the ledger has; after a write of a Reserver has returned, that Reserver's answers never
//     predate the write.
//
// A Reserver is safe for concurrent use. The background work (relay, sweeper, reconciler, cart
// recovery) runs only in Reserver.Run, which the caller runs and owns; the Reserver's methods
// start only short-lived goroutines of their own (a coalesced batch sent for the callers queued
// behind it, the writer of the sweeper's hints), each bounded by WithTimeout.
//
// # Versions
//
// The module is before 1.0: a minor version may change the API. Every change is in the
// repository's CHANGELOG.md, with what to write instead in docs/upgrading.md; docs/versioning.md
// says what may change between versions and how a change of what is stored in Redis is
// announced.
package stock
