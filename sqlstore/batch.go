package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/stockres/stock"
)

// insertRows is the most records one INSERT of a batch writes (6 parameters each; SQLite
// takes 32766 parameters, PostgreSQL and MySQL 65535).
const insertRows = 500

// errRaced aborts a batch transaction whose plan a concurrent transaction overtook: a record
// it meant to insert appeared, or one it meant to restore changed. retryable says true, and
// the transaction runs again with fresh reads.
var errRaced = errors.New("a concurrent transaction changed a record the batch read")

// ApplyBatch applies evs in order, in one transaction, and returns one result per event with
// Apply's meaning. A refusal undoes nothing and does not stop the batch; the first other
// failure (an invalid event, a deduct, confirm or restock of an item with no row, a database
// error) does: the events after it are left unapplied and get an error that wraps no
// sentinel, as stock.BatchStore requires. If the transaction still fails after its retries, the events are
// applied one by one with Apply, stopping the same way.
//
// Rather than run Apply's statements for each event, a batch locks the rows of its items
// (SELECT … FOR UPDATE, in SKU order, so concurrent batches queue instead of deadlocking),
// reads the records its ids already have, works out every event's outcome in order from
// those, and writes the result: one multi-row INSERT of the new records, one UPDATE per
// record it restores, one UPDATE per item.
func (s *Store) ApplyBatch(ctx context.Context, evs []stock.Event) []error {
	errs := make([]error, len(evs))
	stop := func(i int, cause error) { // events after i stay unapplied
		for j := i + 1; j < len(evs); j++ {
			errs[j] = fmt.Errorf("sqlstore: not applied after an earlier failure (%v)", cause)
		}
	}
	var todo []int // the events to write, in order
	for i, ev := range evs {
		ok, err := checkEvent(ev)
		if err != nil {
			errs[i] = err
			stop(i, err)
			break
		}
		if ok {
			todo = append(todo, i)
		}
	}
	if len(todo) == 0 {
		return errs
	}
	var outs []error
	err := s.inTx(ctx, func(tx *sql.Tx) (err error) {
		outs, err = s.applyBatch(ctx, tx, evs, todo)
		return err
	})
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("sqlstore: apply batch: %w", err)
		errs[todo[0]] = err
		stop(todo[0], err)
		return errs
	}
	for k, i := range todo {
		if err == nil {
			errs[i] = outs[k]
		} else {
			errs[i] = s.Apply(ctx, evs[i]) // the transaction failed: one by one
		}
		if errs[i] != nil && !errors.Is(errs[i], stock.ErrRefused) {
			stop(i, errs[i])
			break
		}
	}
	return errs
}

// batchItem is an item's row as locked, and the changes a batch makes to it.
type batchItem struct {
	exists            bool
	remaining         int64 // after the events planned so far
	dRemaining, dLoad int64 // the changes to write
}

// batchRecord is a record as read or planned.
type batchRecord struct {
	ev     stock.Event // the event that created a new record; SKU and ID for a stored one
	typ    stock.EventType
	qty    int64
	status stock.State
	stored bool // the row exists; else it is inserted
}

type recordKey struct{ sku, id string }

// applyBatch plans and writes the events evs[todo[k]] in order, up to the first outcome that
// is neither nil nor a refusal, and returns their outcomes in todo's order (nil for the
// events after that outcome, which it neither plans nor writes).
func (s *Store) applyBatch(ctx context.Context, tx *sql.Tx, evs []stock.Event, todo []int) ([]error, error) {
	items := make(map[string]*batchItem)
	recs := make(map[recordKey]*batchRecord, len(todo))
	ids := make(map[string][]string) // sku → the batch's ids of it
	var skus []string                // distinct, sorted: the order of the item locks
	for _, i := range todo {
		ev := evs[i]
		if _, ok := ids[ev.SKU]; !ok {
			skus = append(skus, ev.SKU)
		}
		ids[ev.SKU] = append(ids[ev.SKU], ev.ID)
	}
	slices.Sort(skus)
	for _, sku := range skus {
		it, err := s.lockItem(ctx, tx, sku)
		if err != nil {
			return nil, err
		}
		if it == nil {
			it = new(batchItem)
		} else {
			it.exists = true
		}
		items[sku] = it
	}
	if s.d == Postgres {
		// Holding the items, a wait for a record lock is almost always a single Apply of the
		// same id that waits for one of these items: a deadlock. Give up after 100 ms rather
		// than after deadlock_timeout (1 s by default); inTx retries.
		if _, err := tx.ExecContext(ctx, `SET LOCAL lock_timeout = '100ms'`); err != nil {
			return nil, err
		}
	}
	// Read the stored records after the item locks, so that a concurrent batch of the same
	// item has committed. A single Apply takes the record first and the item second: if one
	// has an uncommitted record of one of these ids, the insert or flip below waits for it
	// while it waits for the item, a deadlock the database breaks and inTx retries (a record
	// that appeared or changed since this read fails the batch with errRaced, retried too).
	for _, sku := range skus {
		err := s.records(ctx, tx, sku, ids[sku], func(r stock.Record) {
			recs[recordKey{r.SKU, r.ID}] = &batchRecord{ev: stock.Event{SKU: r.SKU, ID: r.ID}, typ: r.Type, qty: r.Qty, status: r.Status, stored: true}
		})
		if err != nil {
			return nil, err
		}
	}

	outs := make([]error, len(todo))
	var added, flipped []*batchRecord // new records; stored records to flip to restored
plan:
	for k, i := range todo {
		ev := evs[i]
		it, key := items[ev.SKU], recordKey{ev.SKU, ev.ID}
		r := recs[key]
		add := func(st stock.State) {
			r = &batchRecord{ev: ev, typ: ev.Type, qty: ev.Qty, status: st}
			recs[key] = r
			added = append(added, r)
		}
		switch ev.Type {
		case stock.EventDeducted, stock.EventConfirmed, stock.EventRestocked:
			if r != nil { // a repeat answers as the first
				if r.status == stock.StateRefused {
					outs[k] = refused(ev)
				}
				continue
			}
			switch {
			case !it.exists:
				// Not a refusal: the item is not loaded here yet, and the relay keeps the event.
				outs[k] = fmt.Errorf("sqlstore: %s %q of %q: %w", ev.Type, ev.ID, ev.SKU, stock.ErrNotLoaded)
				break plan // the events after it stay unapplied
			case ev.Type == stock.EventRestocked:
				add(stock.StateApplied)
				it.remaining += ev.Qty
				it.dRemaining += ev.Qty
				it.dLoad += ev.Qty
			case it.exists && it.remaining >= ev.Qty:
				add(stock.StateApplied)
				it.remaining -= ev.Qty
				it.dRemaining -= ev.Qty
			default:
				add(stock.StateRefused)
				outs[k] = refused(ev)
			}
		default: // stock.EventRestored, stock.EventRefused
			switch {
			case r == nil:
				add(stock.StateRestored) // a tombstone
			case r.status == stock.StateApplied && (r.typ == stock.EventDeducted || r.typ == stock.EventConfirmed):
				r.status = stock.StateRestored
				if r.stored {
					flipped = append(flipped, r)
				}
				it.remaining += r.qty
				it.dRemaining += r.qty
			}
		}
	}

	for chunk := range slices.Chunk(added, insertRows) {
		if err := s.insertRecords(ctx, tx, chunk); err != nil {
			return nil, err
		}
	}
	for _, r := range flipped {
		n, err := affected(tx.ExecContext(ctx, s.q.restore, r.ev.SKU, r.ev.ID))
		if err == nil && n != 1 {
			err = errRaced
		}
		if err != nil {
			return nil, err
		}
	}
	for _, sku := range skus {
		it := items[sku]
		if it.dRemaining == 0 && it.dLoad == 0 {
			continue
		}
		n, err := affected(tx.ExecContext(ctx, s.q.restock, it.dRemaining, it.dLoad, sku))
		if err == nil && n != 1 {
			err = fmt.Errorf("item %q vanished", sku)
		}
		if err != nil {
			return nil, err
		}
	}
	return outs, nil
}

// lockItem locks the row of sku (but on SQLite, whose writers take turns) and returns it; nil
// if there is none.
func (s *Store) lockItem(ctx context.Context, tx *sql.Tx, sku string) (*batchItem, error) {
	it := new(batchItem)
	var loaded int64
	err := tx.QueryRowContext(ctx, s.q.lockItem, sku).Scan(&it.remaining, &loaded)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return it, nil
}

// insertRecords inserts new records in one statement; errRaced if any of them exists.
func (s *Store) insertRecords(ctx context.Context, tx *sql.Tx, rs []*batchRecord) error {
	var b strings.Builder
	b.WriteString(s.q.insertHead)
	args := make([]any, 0, 6*len(rs))
	for k, r := range rs {
		if k > 0 {
			b.WriteString(", ")
		}
		b.WriteString(s.q.insertRow)
		args = append(args, r.ev.SKU, r.ev.ID, r.ev.User, string(r.typ), r.qty, string(r.status))
	}
	b.WriteString(s.d.onConflict())
	n, err := affected(tx.ExecContext(ctx, s.d.rebind(b.String()), args...))
	if isDuplicate(err) || (err == nil && n != int64(len(rs))) {
		return errRaced
	}
	return err
}
