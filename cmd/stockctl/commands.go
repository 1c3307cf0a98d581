package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/stockres/stock"
	"github.com/stockres/stock/sqlstore"
	"github.com/stockres/stock/stockops"
)

type runFunc = func(ctx context.Context, e *env, args []string) error

// commands, in the order of the usage text.
var commands = []command{
	{
		name: "load", args: "SKU QTY", min: 2, max: 2, dsn: dsnOptional,
		short: "create an item with QTY units (and its store row, with -dsn)",
		long: `
Creates SKU in Redis with QTY units available: the preheat before a sale. An item that exists
is never overwritten: add stock to a live item with restock.

With -dsn it first creates the store's tables if missing and the item's row with QTY
remaining. When Redis already has the item and the store does not (it was loaded without
-dsn), it adds the store side only, and only when QTY is the stock Redis accounts for: its
available and held units, plus the units of sales not yet delivered to the store, minus the
restocks not yet delivered (available + held + in flight, as reconcile shows them). Otherwise
it refuses, says the figure, and writes nothing. Redis is left as it is; the relay delivers
the pending events to the new row, and reconcile finds no drift. It loads nothing when the
store already has the item.`,
		example: "stockctl load sneaker-42 100\nstockctl -dsn sqlite:/var/lib/shop.db load sneaker-42 100",
		setup:   func(*flag.FlagSet) runFunc { return cmdLoad },
	},
	{
		name: "restock", args: "SKU ID QTY", min: 3, max: 3,
		short: "add QTY units to a live item, once per ID",
		long: `
Adds QTY units to a loaded item, exactly once per ID: running it again with the same ID is a
replay and adds nothing. The restock is ledgered and queued for the store like a sale.

Exit 1, nothing changed, when Redis does not know the item, when ID was used on it for
something else, or when the item would then hold more than 9007199254740991 units in all
(2^53-1, stock.MaxQty: the message gives the units loaded and available).`,
		example: "stockctl restock sneaker-42 po-2024-117 50",
		setup:   func(*flag.FlagSet) runFunc { return cmdRestock },
	},
	{
		name: "available", args: "SKU", min: 1, max: 1,
		short: "print the units of an item that can be taken now",
		long: `
Prints the units of SKU available now (exit 1 when Redis does not know the item).`,
		example: "stockctl available sneaker-42",
		setup:   func(*flag.FlagSet) runFunc { return cmdAvailable },
	},
	{
		name: "levels", args: "[SKU...]", min: 0, max: -1, dsn: dsnOptional,
		short: "available, held, sold, loaded and closed, per item (all items when none given)",
		long: `
Prints the counters of each item, read atomically: available + held + sold = loaded. Without
SKUs, every item of the registry. With -dsn, a STORE column shows the store's remaining stock.
Exit 1 when an item is not loaded (the others are still printed).`,
		example: "stockctl levels sneaker-42 hoodie-7\nstockctl -json levels",
		setup:   func(*flag.FlagSet) runFunc { return cmdLevels },
	},
	{
		name: "items", args: "", min: 0, max: 0,
		short: "list the registered items",
		long: `
Lists the items in the registry (every item ever loaded under -prefix), sorted.`,
		example: "stockctl items",
		setup:   func(*flag.FlagSet) runFunc { return cmdItems },
	},
	{
		name: "entry", args: "SKU ID", min: 2, max: 2,
		short: "show the ledger entry of one request id",
		long: `
Shows what request ID did to SKU: kind (deduct, hold, restock, tombstone), state (held,
reserved, applied, restored, refused, cancelled, expired), quantity, stock before and after,
time, user and, for a hold, its deadline. Exit 1 when there is no entry (never used, or trimmed
after the retention) or Redis does not know the item (the message says which).`,
		example: "stockctl entry sneaker-42 order-1001",
		setup:   func(*flag.FlagSet) runFunc { return cmdEntry },
	},
	{
		name: "ledger", args: "SKU", min: 1, max: 1,
		short: "list an item's ledger entries",
		long: `
Lists the ledger entries of SKU, oldest first. The ledger is read with HSCAN in pages, so even
a large one never blocks Redis; -limit stops the scan after that many matching entries, which
are then the first found in scan order, not the oldest.`,
		example: "stockctl ledger sneaker-42 -state reserved -limit 20",
		setup: func(fs *flag.FlagSet) runFunc {
			limit := fs.Int("limit", 100, "show at most `N` entries (0: all)")
			state := fs.String("state", "", "only entries in this `STATE`: held, reserved, applied, restored, refused, cancelled, expired")
			return func(ctx context.Context, e *env, args []string) error {
				return cmdLedger(ctx, e, args, *limit, *state)
			}
		},
	},
	{
		name: "close", args: "SKU", min: 1, max: 1,
		short: "stop selling an item (restores, the relay and the reconciler go on)",
		long: `
Closes SKU: deducts and holds are refused, while restores, confirms, cancels, expiry, the relay
and the reconciler go on, so the item's pipeline finishes. Closing a closed item does nothing.`,
		example: "stockctl close sneaker-42",
		setup:   func(*flag.FlagSet) runFunc { return cmdClose(true) },
	},
	{
		name: "reopen", args: "SKU", min: 1, max: 1,
		short: "let a closed item sell again",
		long: `
Reopens a closed SKU for deducts and holds.`,
		example: "stockctl reopen sneaker-42",
		setup:   func(*flag.FlagSet) runFunc { return cmdClose(false) },
	},
	{
		name: "delist", args: "SKU", min: 1, max: 1,
		short: "end an item's sale for good; reconcile -apply retires it later",
		long: `
Delists SKU: it is closed for good (reopen refuses it) and stamped with the time. Restores,
confirms, expiry, the relay and the reconciler go on, so its pipeline finishes. Once the
retention has passed (reconcile's -retention, 24h by default) and a reconcile -apply pass finds
Redis and the store in agreement with nothing pending, that pass retires the item: its keys,
ledger included, are removed, it leaves the registry and may be loaded again. An item the store
does not know is never retired: add its store side first (load -dsn). Delisting twice does
nothing; exit 1 when Redis does not know the item.`,
		example: "stockctl delist sneaker-42",
		setup:   func(*flag.FlagSet) runFunc { return cmdDelist },
	},
	{
		name: "restore", args: "SKU ID", min: 2, max: 2,
		short: "give back exactly what a request id took, once",
		long: `
Gives back exactly what request ID took from SKU (a sale or a live hold), once: a second
restore of the ID is a replay and changes nothing. The restore is queued for the store.

An ID with no ledger entry is refused and nothing changes, unless -tombstone is given: then a
tombstone is written, so that a late request with that ID is refused (ErrRestored).

An item Redis does not know is refused with "not loaded" (exit 1), with -tombstone too: nothing
is written and no tombstone is left, so a mistyped SKU changes nothing.`,
		example: "stockctl restore sneaker-42 order-1001",
		setup: func(fs *flag.FlagSet) runFunc {
			tomb := fs.Bool("tombstone", false, "for an ID with no entry, leave a tombstone that refuses a late request with it")
			return func(ctx context.Context, e *env, args []string) error {
				return cmdRestore(ctx, e, args, *tomb)
			}
		},
	},
	{
		name: "sweep", args: "[SKU]", min: 0, max: 1,
		short: "release expired holds (of every item when none given)",
		long: `
Releases the holds past their deadline, of SKU or of every registered item, and prints the
units released. Expiry also happens on an item's next operation; sweep makes it happen now.
Exit 1 when Redis does not know SKU.`,
		example: "stockctl sweep sneaker-42",
		setup:   func(*flag.FlagSet) runFunc { return cmdSweep },
	},
	{
		name: "reconcile", args: "[SKU...]", min: 0, max: -1, dsn: dsnRequired,
		short: "compare Redis with the store; report only unless -apply (needs -dsn)",
		long: `
Compares each item (SKU..., or every registered item) in Redis with the database of record,
counting the events still pending in the outbox as in flight, and prints one line per item.

By default it only reports. With -apply it repairs what it safely can: a lost item hash is
rebuilt from the store, available stock is adjusted by the drift, lost outbox events are queued
again, ledger entries Redis lost are written back, and settled entries older than -retention
are trimmed. A report-only run cannot see lost outbox events or lost ledger entries; -apply
finds and repairs them.

Without SKUs it is one pass over every item: the registered ones, and the items of the store
that Redis lost from its registry (a restart without persistence, FLUSHALL), which it reports
loudly ("REDIS LOST ITS REGISTRY") and, with -apply, registers again and rebuilds from the
store. Items the store has and Redis never had are listed and left alone. A pass with -apply
that compared every item also records the Redis primaries as reconciled, which lifts the fence
of every FailoverGuard on this Redis (deducts refused after a restart or failover).

An item the store does not know is reported with Redis's figures and needs a human: load -dsn
with the units Redis accounts for (available + held + in flight, which the line says) adds its
store side; nothing else is repaired on it.

Exit status: a report-only run exits 3 when any item drifted, was missing, was missing from the
registry, had lost events or entries, or needs a human, so that a cron job can alert. With
-apply it exits 3 only for what is left: an item that needs a human or could not be repaired;
0 when it repaired everything it found (the lines still say what it repaired). Exit 1 when an
item could not be compared and nothing is left for exit 3. An item a relay kept busy is
reported and not compared.`,
		example: "stockctl -dsn 'postgres://app@db:5432/shop' reconcile\n" +
			"stockctl -dsn sqlite:/var/lib/shop.db reconcile -apply -repair-limit 50 sneaker-42",
		setup: func(fs *flag.FlagSet) runFunc {
			o := reconcileOpts{}
			fs.BoolVar(&o.apply, "apply", false, "repair what was found (the default only reports)")
			fs.Int64Var(&o.limit, "repair-limit", 0, "report a drift above `N` units as needing a human, and leave it unrepaired (0: no limit)")
			fs.DurationVar(&o.retention, "retention", 24*time.Hour, "with -apply, trim settled ledger entries older than `DURATION` (0: never)")
			return func(ctx context.Context, e *env, args []string) error {
				return cmdReconcile(ctx, e, args, o)
			}
		},
	},
	{
		name: "relay-once", args: "[SKU...]", min: 0, max: -1, dsn: dsnRequired,
		short: "deliver the pending outbox events to the store, once (needs -dsn)",
		long: `
Delivers the events waiting in the outboxes of SKU... (or of every registered item) to the
database of record, in order per item, and removes them from the outbox: what a running relay
does, once, for example while the service's relay is down. It runs passes until one finds
nothing due (at most 5), which also hands the items' relay leases back. An item whose last
delivery failed stays in backoff and is skipped until its backoff ends; a failed event is
retried later, with backoff.

It then says what is left in the items' outboxes: "NOT DRAINED" with the events still pending,
per item (not due: in backoff after a failed delivery, leased by a running relay, or queued
since), and "DEAD-LETTERED" with the events no relay will deliver (rejected by the store as
invalid, or orphaned), which need a human; "the outboxes are empty" otherwise. With -json:
pending, dead, and waiting (the items with either).

Exit 1 when an event failed in this run. Events left waiting by the backoff of an earlier
failure do not make it fail: look for NOT DRAINED, or -json's pending.`,
		example: "stockctl -dsn sqlite:/var/lib/shop.db relay-once sneaker-42",
		setup: func(fs *flag.FlagSet) runFunc {
			batch := fs.Int("batch", 128, "claim `N` events from one item at a time")
			lease := fs.Duration("lease", 30*time.Second, "how long (`DURATION`) claimed events stay invisible to other relays")
			return func(ctx context.Context, e *env, args []string) error {
				return cmdRelayOnce(ctx, e, args, *batch, *lease)
			}
		},
	},
	{
		name: "migrate", args: "", min: 0, max: 0, dsn: dsnRequired, noRedis: true,
		short: "create the store's tables if missing (needs -dsn)",
		long: `
Creates the store's two tables (-table-prefix + "items" and + "records") if they do not exist.
It changes no existing table. load with -dsn does it too.`,
		example: "stockctl -dsn 'mysql://app:secret@db:3306/shop' migrate",
		setup:   func(*flag.FlagSet) runFunc { return cmdMigrate },
	},
}

// emit writes v as JSON with -json, or calls text.
func (e *env) emit(v any, text func(w io.Writer)) error {
	if e.g.json {
		enc := json.NewEncoder(e.out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	text(e.out)
	return nil
}

func parseQty(what, s string, zero bool) (int64, error) {
	lo := 1
	if zero {
		lo = 0
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if errors.Is(err, strconv.ErrRange) {
		// A whole number, too large for int64 either way.
		return 0, usagef("%s %s out of range [%d, %d]", what, strings.TrimPrefix(s, "+"), lo, int64(stock.MaxQty))
	}
	if err != nil {
		return 0, usagef("%s %q is not a whole number", what, s)
	}
	if n < int64(lo) || n > stock.MaxQty {
		return 0, usagef("%s %d out of range [%d, %d]", what, n, lo, int64(stock.MaxQty))
	}
	return n, nil
}

func isInvalid(err error) bool { return errors.Is(err, stock.ErrInvalid) }

type receiptJSON struct {
	SKU       string `json:"sku"`
	ID        string `json:"id"`
	Qty       int64  `json:"qty"`
	Remaining int64  `json:"remaining"`
	Replayed  bool   `json:"replayed"`
}

func receiptOf(rc stock.Receipt) receiptJSON {
	return receiptJSON{SKU: rc.SKU, ID: rc.ID, Qty: rc.Qty, Remaining: rc.Remaining, Replayed: rc.Replayed}
}

func cmdLoad(ctx context.Context, e *env, args []string) error {
	sku := args[0]
	qty, err := parseQty("QTY", args[1], true)
	if err != nil {
		return err
	}
	r, err := e.reserver()
	if err != nil {
		return err
	}
	withStore := e.g.dsn != ""
	if withStore {
		st, err := e.openStore(ctx, "load")
		if err != nil {
			return err
		}
		if err := st.Migrate(ctx); err != nil {
			return err
		}
		inRedis := true
		if _, err := r.Levels(ctx, sku); errors.Is(err, stock.ErrNotLoaded) {
			inRedis = false
		} else if err != nil {
			return err
		}
		switch n, err := st.Remaining(ctx, sku); {
		case err == nil && inRedis:
			return fmt.Errorf("%w: %s in Redis and the store; nothing loaded (add stock with restock)", stock.ErrLoaded, sku)
		case err == nil:
			return fmt.Errorf("%w: the store has %s with %d remaining; nothing loaded "+
				"(if Redis lost the item, 'reconcile -apply %s' rebuilds it from the store)", stock.ErrLoaded, sku, n, sku)
		case !errors.Is(err, stock.ErrNotLoaded):
			return err
		}
		if inRedis {
			return addStoreSide(ctx, e, r, st, sku, qty)
		}
		if err := st.Load(ctx, sku, qty); err != nil {
			return err
		}
	}
	if err := r.Load(ctx, sku, qty); err != nil {
		if errors.Is(err, stock.ErrLoaded) {
			err = fmt.Errorf("%w (add stock with restock)", err)
			if withStore {
				err = fmt.Errorf("%w; the store row was created meanwhile: run reconcile", err)
			}
		}
		return err
	}
	return e.emit(loadJSON{sku, qty, withStore, true}, func(w io.Writer) {
		where := "Redis"
		if withStore {
			where = "Redis and the store"
		}
		fmt.Fprintf(w, "loaded %s: %d units in %s\n", sku, qty, where)
	})
}

// loadJSON is load's -json output: the units loaded and the sides written.
type loadJSON struct {
	SKU    string `json:"sku"`
	Loaded int64  `json:"loaded"`
	Store  bool   `json:"store"`
	Redis  bool   `json:"redis"`
}

// storeUnknown is the reconciler's NeedsHuman for an item the store does not know.
const storeUnknown = "the store does not know the item"

// accounted is the stock Redis accounts for in a report of an item the store does not know:
// what the store must start with so that, once Redis's undelivered events reach it, both agree.
func accounted(rp stockops.Report) int64 { return rp.Available + rp.Held + rp.InFlight }

// addStoreSide creates the store row of an item Redis has and the store does not (loaded
// without -dsn), with qty remaining, after checking that qty is the stock Redis accounts for:
// its available and held units plus the net effect of its undelivered events, which the relay
// will apply to the row. The sum does not change under live traffic (a sale moves units from
// available to in flight, a delivery from in flight to the store), so the row agrees with Redis
// whenever it is created.
func addStoreSide(ctx context.Context, e *env, r *stock.Reserver, st *sqlstore.Store, sku string, qty int64) error {
	rec, err := stockops.NewReconciler(r, st, &stock.ReconcileOptions{DryRun: true, Retention: -1})
	if err != nil {
		return err
	}
	rp, err := rec.Item(ctx, sku)
	switch {
	case err != nil:
		return err
	case rp.Busy:
		return fmt.Errorf("a relay held %s while its stock was counted: nothing loaded; try again", sku)
	case rp.Missing:
		return fmt.Errorf("%w: %s vanished from Redis while its stock was counted: nothing loaded", stock.ErrNotLoaded, sku)
	case rp.NeedsHuman != "" && rp.NeedsHuman != storeUnknown:
		return fmt.Errorf("%s: %s; nothing loaded", sku, rp.NeedsHuman)
	}
	want := accounted(rp)
	figures := fmt.Sprintf("%d available + %d held, %d in flight", rp.Available, rp.Held, rp.InFlight)
	if want < 0 {
		return fmt.Errorf("the undelivered events of %s take more than Redis has (%s): nothing loaded; this needs a human", sku, figures)
	}
	if qty != want {
		return fmt.Errorf("QTY %d: Redis accounts for %d units of %s (%s), and the store side must start with that many; nothing loaded",
			qty, want, sku, figures)
	}
	if err := st.Load(ctx, sku, qty); err != nil {
		return err
	}
	after, err := rec.Item(ctx, sku)
	if err == nil && !after.Busy && (after.Drift != 0 || after.NeedsHuman != "") {
		err = fmt.Errorf("added %s to the store with %d units, but reconcile finds: %s", sku, qty, after)
	}
	if err != nil {
		return fmt.Errorf("%w (the store row was created: run reconcile)", err)
	}
	return e.emit(loadJSON{sku, qty, true, false}, func(w io.Writer) {
		fmt.Fprintf(w, "added %s to the store: %d units (Redis had it: %s); reconcile finds no drift\n", sku, qty, figures)
	})
}

func cmdRestock(ctx context.Context, e *env, args []string) error {
	qty, err := parseQty("QTY", args[2], false)
	if err != nil {
		return err
	}
	r, err := e.reserver()
	if err != nil {
		return err
	}
	sku, id := args[0], args[1]
	rc, err := r.Restock(ctx, sku, id, qty)
	switch {
	case errors.Is(err, stock.ErrNotLoaded):
		return notLoaded(sku, "nothing restocked")
	case isInvalid(err):
		return restockRefused(ctx, r, sku, id, qty, err)
	case err != nil:
		return err
	}
	return e.emit(receiptOf(rc), func(w io.Writer) {
		if rc.Replayed {
			fmt.Fprintf(w, "%s/%s was already restocked (+%d): nothing changed\n", rc.SKU, rc.ID, rc.Qty)
			return
		}
		fmt.Fprintf(w, "restocked %s/%s: +%d, %d available\n", rc.SKU, rc.ID, rc.Qty, rc.Remaining)
	})
}

// notLoaded is the error of a command on an item Redis does not know, naming it, as the
// library's reads do ("stock: item not loaded: SKU").
func notLoaded(sku, what string) error {
	return fmt.Errorf("%w: %s (%s)", stock.ErrNotLoaded, sku, what)
}

// unknownID explains an id with no ledger entry on sku: the item itself is not loaded (then
// ifNotLoaded says what was not done), or it is and has no entry for the id (then more, if set,
// follows). It reads the item's levels only.
func unknownID(ctx context.Context, r *stock.Reserver, sku, id, ifNotLoaded, more string) error {
	if _, err := r.Levels(ctx, sku); errors.Is(err, stock.ErrNotLoaded) {
		return notLoaded(sku, ifNotLoaded)
	}
	msg := fmt.Sprintf("item %s has no ledger entry for id %s (never used on this item, or trimmed after the retention)", sku, id)
	if more != "" {
		msg += "; " + more
	}
	return fmt.Errorf("%w: %s", stock.ErrUnknownID, msg)
}

// restockRefused explains a restock the library refused as invalid though SKU, ID and QTY are
// each valid: the item would hold more than stock.MaxQty units in all. It reads the item's
// levels to say so with the figures; on any other cause it returns err as it is.
func restockRefused(ctx context.Context, r *stock.Reserver, sku, id string, qty int64, err error) error {
	lv, lerr := r.Levels(ctx, sku)
	if lerr != nil || lv.Loaded <= stock.MaxQty-qty {
		return err
	}
	// Not ErrInvalid: the command line is right, the item's stock is what refuses it (exit 1).
	return fmt.Errorf("restock %s/%s refused, nothing changed: %s has %d units loaded (%d available), "+
		"and QTY %d more would take it to %d, past the most an item can hold, %d (2^53-1, stock.MaxQty)",
		sku, id, sku, lv.Loaded, lv.Available, qty, uint64(lv.Loaded)+uint64(qty), int64(stock.MaxQty))
}

func cmdAvailable(ctx context.Context, e *env, args []string) error {
	r, err := e.reserver()
	if err != nil {
		return err
	}
	lv, err := r.Levels(ctx, args[0])
	if err != nil {
		return err
	}
	n := lv.Available
	return e.emit(struct {
		SKU       string `json:"sku"`
		Available int64  `json:"available"`
	}{args[0], n}, func(w io.Writer) { fmt.Fprintln(w, n) })
}

// items returns the registry, sorted.
func items(ctx context.Context, r *stock.Reserver) ([]string, error) {
	out := []string{}
	for sku, err := range stockops.Items(ctx, r) {
		if err != nil {
			return nil, err
		}
		out = append(out, sku)
	}
	slices.Sort(out)
	return out, nil
}

type levelsJSON struct {
	SKU            string `json:"sku"`
	Available      int64  `json:"available"`
	Held           int64  `json:"held"`
	Sold           int64  `json:"sold"`
	Loaded         int64  `json:"loaded"`
	Closed         bool   `json:"closed"`
	StoreRemaining *int64 `json:"store_remaining,omitempty"`
	// Error is stock.Outcome's label of the error ("not_loaded", ...); Message says more.
	Error   string `json:"error,omitempty"`
	Message string `json:"message,omitempty"`
}

func cmdLevels(ctx context.Context, e *env, args []string) error {
	r, err := e.reserver()
	if err != nil {
		return err
	}
	skus := args
	if len(skus) == 0 {
		if skus, err = items(ctx, r); err != nil {
			return err
		}
	}
	st := e.store
	if e.g.dsn != "" {
		if st, err = e.openStore(ctx, "levels"); err != nil {
			return err
		}
	}
	rows := make([]levelsJSON, 0, len(skus))
	var errs []error
	for _, sku := range skus {
		row := levelsJSON{SKU: sku}
		lv, err := r.Levels(ctx, sku)
		if err != nil {
			row.Error, row.Message = stock.Outcome(err), err.Error()
			errs = append(errs, err)
		} else {
			row.Available, row.Held, row.Sold, row.Loaded, row.Closed = lv.Available, lv.Held, lv.Sold, lv.Loaded, lv.Closed
		}
		if st != nil {
			n, err := st.Remaining(ctx, sku)
			if err == nil {
				row.StoreRemaining = &n
			} else if !errors.Is(err, stock.ErrNotLoaded) {
				return err
			}
		}
		rows = append(rows, row)
	}
	err = e.emit(rows, func(w io.Writer) {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		head := []string{"SKU", "AVAILABLE", "HELD", "SOLD", "LOADED", "CLOSED"}
		if st != nil {
			head = append(head, "STORE")
		}
		fmt.Fprintln(tw, strings.Join(head, "\t"))
		for _, row := range rows {
			cells := []string{row.SKU, "-", "-", "-", "-", strings.ReplaceAll(row.Error, "_", " ")}
			if row.Error == "" {
				cells = []string{row.SKU, itoa(row.Available), itoa(row.Held), itoa(row.Sold), itoa(row.Loaded), yesNo(row.Closed)}
			}
			if st != nil {
				if row.StoreRemaining != nil {
					cells = append(cells, itoa(*row.StoreRemaining))
				} else {
					cells = append(cells, "-")
				}
			}
			fmt.Fprintln(tw, strings.Join(cells, "\t"))
		}
		tw.Flush()
	})
	if err != nil {
		return err
	}
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	return fmt.Errorf("%d of %d items failed: %w", len(errs), len(skus), errors.Join(errs...))
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func cmdItems(ctx context.Context, e *env, _ []string) error {
	r, err := e.reserver()
	if err != nil {
		return err
	}
	skus, err := items(ctx, r)
	if err != nil {
		return err
	}
	return e.emit(skus, func(w io.Writer) {
		for _, s := range skus {
			fmt.Fprintln(w, s)
		}
	})
}

type entryJSON struct {
	SKU      string     `json:"sku"`
	ID       string     `json:"id"`
	User     string     `json:"user,omitempty"`
	Kind     stock.Kind `json:"kind"`
	State    string     `json:"state"`
	Qty      int64      `json:"qty"`
	Before   int64      `json:"before"`
	After    int64      `json:"after"`
	At       time.Time  `json:"at"`
	Deadline *time.Time `json:"deadline,omitempty"`
}

func entryOf(en stock.Entry) entryJSON {
	j := entryJSON{SKU: en.SKU, ID: en.ID, User: en.User, Kind: en.Kind, State: string(en.State),
		Qty: en.Qty, Before: en.Before, After: en.After, At: en.At.UTC()}
	if !en.Deadline.IsZero() {
		d := en.Deadline.UTC()
		j.Deadline = &d
	}
	return j
}

const timeLayout = "2006-01-02 15:04:05.000 MST"

func cmdEntry(ctx context.Context, e *env, args []string) error {
	r, err := e.reserver()
	if err != nil {
		return err
	}
	en, err := r.Ledger(ctx, args[0], args[1])
	if errors.Is(err, stock.ErrUnknownID) {
		return unknownID(ctx, r, args[0], args[1], "no ledger to read", "")
	}
	if err != nil {
		return err
	}
	return e.emit(entryOf(en), func(w io.Writer) {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "sku\t%s\nid\t%s\nkind\t%s\nstate\t%s\nqty\t%d\nbefore\t%d\nafter\t%d\nat\t%s\n",
			en.SKU, en.ID, en.Kind, en.State, en.Qty, en.Before, en.After, en.At.Format(timeLayout))
		if en.User != "" {
			fmt.Fprintf(tw, "user\t%s\n", en.User)
		}
		if !en.Deadline.IsZero() {
			fmt.Fprintf(tw, "deadline\t%s\n", en.Deadline.Format(timeLayout))
		}
		tw.Flush()
	})
}

var states = []stock.State{stock.StateHeld, stock.StateReserved, stock.StateApplied, stock.StateRestored,
	stock.StateRefused, stock.StateCancelled, stock.StateExpired}

func cmdLedger(ctx context.Context, e *env, args []string, limit int, state string) error {
	if limit < 0 {
		return usagef("-limit %d is negative", limit)
	}
	if state != "" && !slices.Contains(states, stock.State(state)) {
		return usagef("-state %q: want one of held, reserved, applied, restored, refused, cancelled, expired", state)
	}
	r, err := e.reserver()
	if err != nil {
		return err
	}
	// An empty ledger and an unknown item look alike: say which.
	var entries []stock.Entry
	truncated := false
	for en, err := range stockops.Entries(ctx, r, args[0]) {
		if err != nil {
			return err
		}
		if state != "" && string(en.State) != state {
			continue
		}
		if limit > 0 && len(entries) == limit {
			truncated = true
			break
		}
		entries = append(entries, en)
	}
	if len(entries) == 0 {
		if _, err := r.Levels(ctx, args[0]); err != nil {
			return err
		}
	}
	slices.SortFunc(entries, func(a, b stock.Entry) int {
		return cmp.Or(a.At.Compare(b.At), cmp.Compare(a.ID, b.ID))
	})
	if truncated {
		fmt.Fprintf(e.errOut, "stockctl ledger: showing the first %d entries found (scan order, not the oldest); -limit 0 shows all\n", limit)
	}
	out := make([]entryJSON, 0, len(entries))
	for _, en := range entries {
		out = append(out, entryOf(en))
	}
	return e.emit(out, func(w io.Writer) {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "AT\tID\tKIND\tSTATE\tQTY\tBEFORE\tAFTER\tUSER\tDEADLINE")
		for _, en := range entries {
			dl := "-"
			if !en.Deadline.IsZero() {
				dl = en.Deadline.Format(timeLayout)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", en.At.Format(timeLayout), en.ID, en.Kind, en.State,
				en.Qty, en.Before, en.After, cmp.Or(en.User, "-"), dl)
		}
		tw.Flush()
	})
}

func cmdClose(closed bool) runFunc {
	return func(ctx context.Context, e *env, args []string) error {
		r, err := e.reserver()
		if err != nil {
			return err
		}
		verb := "closed"
		if closed {
			err = r.CloseItem(ctx, args[0])
		} else {
			verb = "reopened"
			err = r.ReopenItem(ctx, args[0])
		}
		if err != nil {
			return err
		}
		return e.emit(struct {
			SKU    string `json:"sku"`
			Closed bool   `json:"closed"`
		}{args[0], closed}, func(w io.Writer) { fmt.Fprintf(w, "%s %s\n", verb, args[0]) })
	}
}

func cmdDelist(ctx context.Context, e *env, args []string) error {
	r, err := e.reserver()
	if err != nil {
		return err
	}
	if err := r.Delist(ctx, args[0]); err != nil {
		return err
	}
	return e.emit(struct {
		SKU      string `json:"sku"`
		Delisted bool   `json:"delisted"`
	}{args[0], true}, func(w io.Writer) {
		fmt.Fprintf(w, "delisted %s: closed for good; once the retention has passed and Redis and the store agree, reconcile -apply retires it\n", args[0])
	})
}

func cmdRestore(ctx context.Context, e *env, args []string, tombstone bool) error {
	sku, id := args[0], args[1]
	r, err := e.reserver()
	if err != nil {
		return err
	}
	if !tombstone {
		if _, err := r.Ledger(ctx, sku, id); err != nil {
			if errors.Is(err, stock.ErrUnknownID) {
				return unknownID(ctx, r, sku, id, "nothing restored", "nothing restored (-tombstone leaves a tombstone that refuses a late request with this id)")
			}
			return err
		}
	} else if _, err := r.Levels(ctx, sku); err != nil {
		// A SKU Redis does not know is a typo far more often than a cancel that overtook the
		// item's load: leave no tombstone on it (the library would, in the item's ledger).
		if errors.Is(err, stock.ErrNotLoaded) {
			return notLoaded(sku, "nothing restored, no tombstone left")
		}
		return err
	}
	rc, err := r.Restore(ctx, sku, id)
	if errors.Is(err, stock.ErrNotLoaded) {
		// The library writes nothing, no tombstone either, on an item it does not know: a
		// mistyped SKU must not look like a restored id.
		return notLoaded(sku, "nothing restored, no tombstone left")
	}
	if tombstone && errors.Is(err, stock.ErrUnknownID) {
		return e.emit(struct {
			SKU       string `json:"sku"`
			ID        string `json:"id"`
			Tombstone bool   `json:"tombstone"`
		}{sku, id, true}, func(w io.Writer) {
			fmt.Fprintf(w, "%s/%s had taken nothing: left a tombstone, a late request with this id will be refused\n", sku, id)
		})
	}
	if err != nil {
		return err
	}
	return e.emit(receiptOf(rc), func(w io.Writer) {
		if rc.Replayed {
			fmt.Fprintf(w, "%s/%s was already given back (qty %d): nothing changed\n", sku, id, rc.Qty)
			return
		}
		fmt.Fprintf(w, "restored %s/%s: +%d, %d available\n", sku, id, rc.Qty, rc.Remaining)
	})
}

func cmdSweep(ctx context.Context, e *env, args []string) error {
	r, err := e.reserver()
	if err != nil {
		return err
	}
	var n int64
	if len(args) == 1 {
		n, err = stockops.Sweep(ctx, r, args[0])
		if err == nil && n == 0 {
			// Nothing released: say so when it is because Redis does not know the item.
			if _, lerr := r.Levels(ctx, args[0]); errors.Is(lerr, stock.ErrNotLoaded) {
				return notLoaded(args[0], "nothing to sweep")
			}
		}
	} else {
		n, err = stockops.Sweep(ctx, r)
	}
	if err != nil {
		return err
	}
	return e.emit(struct {
		Released int64 `json:"released"`
	}{n}, func(w io.Writer) { fmt.Fprintf(w, "released %d units of expired holds\n", n) })
}

type reconcileOpts struct {
	apply     bool
	limit     int64
	retention time.Duration
}

type reportJSON struct {
	SKU            string `json:"sku"`
	Busy           bool   `json:"busy,omitempty"`
	Missing        bool   `json:"missing,omitempty"`
	Available      int64  `json:"available"`
	Held           int64  `json:"held"`
	StoreRemaining int64  `json:"store_remaining"`
	Pending        int    `json:"pending"`
	InFlight       int64  `json:"in_flight"`
	Drift          int64  `json:"drift"`
	Rebuilt        bool   `json:"rebuilt,omitempty"`
	Adjusted       int64  `json:"adjusted,omitempty"`
	Requeued       int    `json:"requeued,omitempty"`
	Rerecorded     int    `json:"rerecorded,omitempty"`
	Trimmed        int    `json:"trimmed,omitempty"`
	NeedsHuman     string `json:"needs_human,omitempty"`
	Unregistered   bool   `json:"unregistered,omitempty"` // Redis had lost it from its registry
	Error          string `json:"error,omitempty"`
	// Found is set when the item drifted, was missing, lost events or entries, or needs a
	// human, repaired or not: what makes a report-only run exit 3.
	Found bool `json:"found"`
	// Left is set when something found is left: the item needs a human or was not repaired
	// (every finding in a report-only run). It is what makes the exit status 3.
	Left bool `json:"left"`
}

// found reports whether a report is worth an alert.
func found(rp stockops.Report) bool {
	return rp.Drift != 0 || rp.Missing || rp.NeedsHuman != "" || rp.Rebuilt || rp.Requeued > 0 || rp.Rerecorded > 0 || rp.Unregistered
}

// left reports whether a report leaves something for the next run or a human: with -apply, an
// item that needs a human, a lost hash not rebuilt, or a drift neither adjusted away nor rebuilt
// (the reconciler says why in NeedsHuman in every case it knows of); in a report-only run,
// everything found.
func left(rp stockops.Report, apply bool) bool {
	if !apply {
		return found(rp)
	}
	return rp.NeedsHuman != "" || (rp.Missing && !rp.Rebuilt) || (rp.Drift != 0 && !rp.Rebuilt && rp.Adjusted != -rp.Drift)
}

func cmdReconcile(ctx context.Context, e *env, args []string, o reconcileOpts) error {
	if o.limit < 0 {
		return usagef("-repair-limit %d is negative", o.limit)
	}
	if o.retention < 0 {
		return usagef("-retention %v is negative", o.retention)
	}
	r, st, err := e.reserverAndStore(ctx, "reconcile")
	if err != nil {
		return err
	}
	retention := o.retention
	if retention == 0 {
		retention = -1 // -retention 0 is "never"; a zero ReconcileOptions.Retention is the 24h default
	}
	rec, err := stockops.NewReconciler(r, st, &stock.ReconcileOptions{DryRun: !o.apply, RepairLimit: o.limit, Retention: retention})
	if err != nil {
		return err
	}
	// Without SKUs, one pass over every item (which finds the items Redis lost from its registry
	// and lifts FailoverGuard fences); with SKUs, those items one by one.
	var pass stockops.PassResult
	if len(args) == 0 {
		pass, err = rec.Pass(ctx)
		if err != nil && len(pass.Reports) == 0 {
			return err // nothing was compared
		}
	} else {
		for _, sku := range args {
			rp, err := rec.Item(ctx, sku)
			pass.Reports = append(pass.Reports, rp)
			pass.Errors = append(pass.Errors, err)
			if rp.Unregistered {
				pass.Unregistered = append(pass.Unregistered, sku)
			}
		}
	}
	skus := make([]string, len(pass.Reports))
	var out []reportJSON
	var lines []string
	var nFound, nLeft, nHuman, nBusy int
	var errs []error
	for i, rp := range pass.Reports {
		err := pass.Errors[i]
		sku := rp.SKU
		skus[i] = sku
		j := reportJSON{SKU: rp.SKU, Busy: rp.Busy, Missing: rp.Missing, Available: rp.Available, Held: rp.Held,
			StoreRemaining: rp.StoreRemaining, Pending: rp.Pending, InFlight: rp.InFlight, Drift: rp.Drift,
			Rebuilt: rp.Rebuilt, Adjusted: rp.Adjusted, Requeued: rp.Requeued, Rerecorded: rp.Rerecorded,
			Trimmed: rp.Trimmed, NeedsHuman: rp.NeedsHuman, Unregistered: rp.Unregistered, Found: found(rp), Left: left(rp, o.apply)}
		line := rp.String()
		if err == nil && rp.NeedsHuman == storeUnknown {
			// The way out, with the figure load checks.
			line += fmt.Sprintf(" (Redis accounts for %d units: 'stockctl load -dsn DSN %s %d' adds its store side; "+
				"then 'stockctl delist %s' if it is not to be sold)", accounted(rp), sku, accounted(rp), sku)
		}
		if err != nil {
			j.Error = err.Error()
			line = fmt.Sprintf("%s: ERROR: %v", sku, err)
			errs = append(errs, err)
		}
		if j.Found {
			nFound++
		}
		if j.Left {
			nLeft++
		}
		if rp.NeedsHuman != "" {
			nHuman++
		}
		if rp.Busy {
			nBusy++
		}
		out = append(out, j)
		lines = append(lines, line)
	}
	if n := len(pass.Unregistered); n > 0 {
		what := "registered again"
		if !o.apply {
			what = "-apply registers them again and rebuilds the lost ones from the store"
		}
		lines = append(lines, fmt.Sprintf("REDIS LOST ITS REGISTRY: %d items of the store were not in Redis's registry of items (%s): %s",
			n, what, strings.Join(pass.Unregistered, ", ")))
	}
	if len(pass.StoreOnly) > 0 {
		lines = append(lines, fmt.Sprintf("in the store only, never in Redis (left alone; 'load' puts them on sale): %s",
			strings.Join(pass.StoreOnly, ", ")))
	}
	switch {
	case pass.EpochRecorded:
		lines = append(lines, "every item compared: the Redis primaries are recorded as reconciled (FailoverGuard fences lift)")
	case pass.EpochErr != nil:
		lines = append(lines, fmt.Sprintf("WARNING: FailoverGuard fences stay: %v", pass.EpochErr))
	}
	if pass.NeedsHuman != "" {
		lines = append(lines, "REDIS NEEDS A HUMAN: "+pass.NeedsHuman)
	}
	summary := fmt.Sprintf("items: %d, with drift or losses: %d, need a human: %d, busy: %d, errors: %d", len(skus), nFound, nHuman, nBusy, len(errs))
	if o.apply {
		summary += fmt.Sprintf(", left: %d", nLeft)
	} else {
		summary += " (report only: nothing repaired; -apply repairs)"
	}
	epochErr := ""
	if pass.EpochErr != nil {
		epochErr = pass.EpochErr.Error()
	}
	err = e.emit(struct {
		Apply         bool         `json:"apply"`
		Found         bool         `json:"found"`
		Left          bool         `json:"left"`
		Reports       []reportJSON `json:"reports"`
		Unregistered  []string     `json:"unregistered,omitempty"`
		StoreOnly     []string     `json:"store_only,omitempty"`
		EpochRecorded bool         `json:"epoch_recorded,omitempty"`
		EpochError    string       `json:"epoch_error,omitempty"`
		NeedsHuman    string       `json:"needs_human,omitempty"` // of Redis as a whole: evictions
	}{o.apply, nFound > 0 || pass.NeedsHuman != "", nLeft > 0 || pass.NeedsHuman != "", append([]reportJSON{}, out...), pass.Unregistered, pass.StoreOnly, pass.EpochRecorded, epochErr, pass.NeedsHuman}, func(w io.Writer) {
		for _, l := range lines {
			fmt.Fprintln(w, l)
		}
		fmt.Fprintln(w, summary)
	})
	if err != nil {
		return err
	}
	switch {
	case nLeft > 0 && o.apply:
		return driftError{fmt.Sprintf("%d of %d items left unrepaired or need a human", nLeft, len(skus))}
	case nLeft > 0:
		return driftError{fmt.Sprintf("%d of %d items drifted or need a human", nLeft, len(skus))}
	case pass.NeedsHuman != "":
		return driftError{"Redis needs a human: " + pass.NeedsHuman}
	case len(errs) == 1:
		return errs[0]
	case len(errs) > 1:
		return fmt.Errorf("%d items could not be compared: %w", len(errs), errors.Join(errs...))
	}
	return nil
}

func cmdRelayOnce(ctx context.Context, e *env, args []string, batch int, lease time.Duration) error {
	r, st, err := e.reserverAndStore(ctx, "relay-once")
	if err != nil {
		return err
	}
	opts := &stock.RelayOptions{Batch: batch, Lease: lease}
	if len(args) > 0 {
		opts.Items = args
	}
	rl, err := stockops.NewRelay(r, st, nil, opts)
	if err != nil {
		return err
	}
	// Once stops after a batch smaller than -batch and keeps the item's lease until it runs
	// out; a pass that finds nothing due hands it back. Events that failed are in backoff and
	// are not claimed again by the next pass.
	var total stockops.RelayStats
	var first error
	passes := 0
	for passes < 5 {
		s, err := rl.Once(ctx)
		passes++
		total.Add(s)
		if err != nil && first == nil {
			first = err
		}
		if s.Claimed == 0 || ctx.Err() != nil {
			break
		}
	}
	// What still waits: events not due (in backoff after a failed delivery, leased by a running
	// relay) or queued since, and dead-lettered ones. A run that delivered nothing must not look
	// like an empty outbox.
	skus := args
	if len(skus) == 0 {
		if skus, err = items(ctx, r); err != nil {
			return errors.Join(first, err)
		}
	}
	var waiting []waitJSON
	var pending, dead int64
	for _, sku := range skus {
		p, d, err := stockops.Pending(ctx, r, sku)
		if err != nil {
			return errors.Join(first, err)
		}
		if p > 0 || d > 0 {
			waiting = append(waiting, waitJSON{SKU: sku, Pending: p, Dead: d})
			pending += p
			dead += d
		}
	}
	j := struct {
		Claimed      int        `json:"claimed"`
		Delivered    int        `json:"delivered"`
		Refused      int        `json:"refused"`
		Retried      int        `json:"retried"`
		Orphaned     int        `json:"orphaned"`
		Redelivered  int        `json:"redelivered"`
		DeadLettered int        `json:"dead_lettered"`
		Passes       int        `json:"passes"`
		Pending      int64      `json:"pending"` // events still in the outboxes after the run
		Dead         int64      `json:"dead"`    // events in the dead-letter sets
		Waiting      []waitJSON `json:"waiting"` // the items with either
		Error        string     `json:"error,omitempty"`
	}{total.Claimed, total.Delivered, total.Refused, total.Retried, total.Orphaned, total.Redelive, total.DeadLettered,
		passes, pending, dead, append([]waitJSON{}, waiting...), ""}
	if first != nil {
		j.Error = first.Error()
	}
	if err := e.emit(j, func(w io.Writer) {
		fmt.Fprintf(w, "delivered %d events (claimed %d, refused by the store %d, retried later %d, orphaned %d, dead-lettered %d, redelivered %d) in %d passes\n",
			total.Delivered, total.Claimed, total.Refused, total.Retried, total.Orphaned, total.DeadLettered, total.Redelive, passes)
		var withPending, withDead []string
		for _, wt := range waiting {
			if wt.Pending > 0 {
				withPending = append(withPending, fmt.Sprintf("%s (%d)", wt.SKU, wt.Pending))
			}
			if wt.Dead > 0 {
				withDead = append(withDead, fmt.Sprintf("%s (%d)", wt.SKU, wt.Dead))
			}
		}
		if pending > 0 {
			fmt.Fprintf(w, "NOT DRAINED: %s of %s still in the outbox, not due (in backoff after a failed delivery, "+
				"or leased by a running relay) or queued since: %s\n",
				plural(pending, "event"), plural(int64(len(withPending)), "item"), listSome(withPending))
		}
		if dead > 0 {
			fmt.Fprintf(w, "DEAD-LETTERED: %s of %s, never delivered (rejected by the store as invalid, or orphaned): "+
				"they need a human; reconcile reports the items: %s\n",
				plural(dead, "event"), plural(int64(len(withDead)), "item"), listSome(withDead))
		}
		if pending == 0 && dead == 0 {
			fmt.Fprintln(w, "the outboxes are empty")
		}
	}); err != nil {
		return err
	}
	return first
}

// waitJSON is an item with events left after relay-once.
type waitJSON struct {
	SKU     string `json:"sku"`
	Pending int64  `json:"pending"`
	Dead    int64  `json:"dead"`
}

func plural(n int64, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// listSome joins the first 10 of l, and says how many more there are.
func listSome(l []string) string {
	const most = 10
	if len(l) <= most {
		return strings.Join(l, ", ")
	}
	return fmt.Sprintf("%s and %d more (-json lists them all)", strings.Join(l[:most], ", "), len(l)-most)
}

func cmdMigrate(ctx context.Context, e *env, _ []string) error {
	st, err := e.openStore(ctx, "migrate")
	if err != nil {
		return err
	}
	if err := st.Migrate(ctx); err != nil {
		return err
	}
	return e.emit(struct {
		Tables []string `json:"tables"`
	}{[]string{e.g.tablePrefix + "items", e.g.tablePrefix + "records"}}, func(w io.Writer) {
		fmt.Fprintf(w, "tables %sitems and %srecords are ready\n", e.g.tablePrefix, e.g.tablePrefix)
	})
}
