package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/stockres/stock"
)

// Interface checks.
var (
	_ stock.Store        = (*Store)(nil)
	_ stock.RecordLister = (*Store)(nil)
	_ stock.BatchStore   = (*Store)(nil)
)

const (
	maxAttempts   = 10       // tries of one transaction that fails with a retryable error
	recordsPage   = 500      // ids per query in Records
	maxPrefix     = 48       // longest table prefix; the longest table name is prefix + "records"
	defaultPrefix = "stock_" // the table prefix unless WithTablePrefix says otherwise; the schema files' names have it
)

// Store is a stock.Store on a SQL database. It is safe for concurrent use by multiple
// goroutines and processes. Create one with New; the zero value is not usable.
type Store struct {
	db     *sql.DB
	d      Dialect
	q      queries
	prefix string // table prefix, which names the migration lock
}

type options struct {
	prefix string
}

// Option configures a Store.
type Option func(*options) error

// WithTablePrefix sets the prefix of the table names: the tables are prefix+"items" and
// prefix+"records". It may be empty, or up to 48 ASCII letters, digits and underscores not
// starting with a digit. The default is "stock_".
func WithTablePrefix(prefix string) Option {
	return func(o *options) error {
		if len(prefix) > maxPrefix {
			return invalid("table prefix longer than %d bytes", maxPrefix)
		}
		for i, c := range prefix {
			if c != '_' && !('a' <= c && c <= 'z') && !('A' <= c && c <= 'Z') && !(i > 0 && '0' <= c && c <= '9') {
				return invalid("table prefix %q: only ASCII letters, digits and '_' (not first) are allowed", prefix)
			}
		}
		o.prefix = prefix
		return nil
	}
}

// New returns a Store on db, which speaks dialect d. It runs no statement: call Migrate to
// create the tables. The caller owns db.
func New(db *sql.DB, d Dialect, opts ...Option) (*Store, error) {
	if db == nil {
		return nil, invalid("nil db")
	}
	if d != Postgres && d != MySQL && d != SQLite {
		return nil, invalid("unknown dialect %v", d)
	}
	o := options{prefix: defaultPrefix}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	return &Store{db: db, d: d, q: newQueries(d, d.quote(o.prefix+"items"), d.quote(o.prefix+"records")), prefix: o.prefix}, nil
}

// queries are the statements of a Store, in the dialect's syntax.
type queries struct {
	schema     []string
	load       string // sku, qty, qty
	remaining  string // sku
	lockItem   string // sku → remaining, loaded; locks the row (but on SQLite, whose writers take turns)
	insert     string // sku, id, user, type, qty, status
	insertHead string // insert up to VALUES, for a multi-row insert
	insertRow  string // insert's VALUES tuple, with ? placeholders
	status     string // sku, id → status, type
	take       string // qty, sku, qty
	refuse     string // sku, id
	restore    string // sku, id
	giveBack   string // sku, id, sku
	restock    string // qty, qty, sku
	drop       string // sku, id
	list       string // sku, after, limit
	records    string // the Records query up to "id IN (", where the ids' placeholders follow
}

func newQueries(d Dialect, items, records string) queries {
	now := d.now()
	cols := "sku, id, user_id, type, qty, status, created_at"
	q := queries{
		schema:     d.schema(items, records),
		load:       `INSERT INTO ` + items + ` (sku, remaining, loaded, updated_at) VALUES (?, ?, ?, ` + now + `)`,
		remaining:  `SELECT remaining FROM ` + items + ` WHERE sku = ?`,
		insertHead: `INSERT INTO ` + records + ` (sku, id, user_id, type, qty, status, created_at, updated_at) VALUES `,
		insertRow:  `(?, ?, ?, ?, ?, ?, ` + now + `, ` + now + `)`,
		status:     `SELECT status, type FROM ` + records + ` WHERE sku = ? AND id = ?`,
		take:       `UPDATE ` + items + ` SET remaining = remaining - ?, updated_at = ` + now + ` WHERE sku = ? AND remaining >= ?`,
		refuse:     `UPDATE ` + records + ` SET status = 'refused', updated_at = ` + now + ` WHERE sku = ? AND id = ?`,
		restore: `UPDATE ` + records + ` SET status = 'restored', updated_at = ` + now +
			` WHERE sku = ? AND id = ? AND status = 'applied' AND type IN ('deducted', 'confirmed')`,
		giveBack: `UPDATE ` + items + ` SET remaining = remaining + (SELECT qty FROM ` + records +
			` WHERE sku = ? AND id = ?), updated_at = ` + now + ` WHERE sku = ?`,
		restock: `UPDATE ` + items + ` SET remaining = remaining + ?, loaded = loaded + ?, updated_at = ` + now + ` WHERE sku = ?`,
		drop:    `DELETE FROM ` + records + ` WHERE sku = ? AND id = ?`,
		list:    `SELECT ` + cols + ` FROM ` + records + ` WHERE sku = ? AND id > ? ORDER BY id LIMIT ?`,
		records: `SELECT ` + cols + ` FROM ` + records + ` WHERE sku = ? AND id IN (`,
	}
	if d == Postgres {
		// One index probe per id, whatever the statistics say. With "id IN (…)", a generic
		// plan made while the table was small filters every record of the item instead: 10 ms
		// per 100 ids at 5,000 records, growing with the item until the next ANALYZE.
		q.records = `SELECT r.sku, r.id, r.user_id, r.type, r.qty, r.status, r.created_at ` +
			`FROM unnest(?::text[]) AS x(id), LATERAL (SELECT * FROM ` + records +
			` WHERE sku = ? AND id = x.id COLLATE "C" LIMIT 1) AS r`
	}
	q.lockItem = `SELECT remaining, loaded FROM ` + items + ` WHERE sku = ?`
	if d != SQLite {
		q.lockItem += ` FOR UPDATE`
	}
	q.insert = q.insertHead + q.insertRow + d.onConflict()
	if d != MySQL { // MySQL reports the duplicate as error 1062
		q.load += ` ON CONFLICT (sku) DO NOTHING`
	}
	for _, p := range []*string{&q.load, &q.remaining, &q.lockItem, &q.insert, &q.status, &q.take, &q.refuse, &q.restore, &q.giveBack, &q.restock, &q.drop, &q.list, &q.records} {
		*p = d.rebind(*p)
	}
	return q
}

// Load creates the item sku with qty units (0 to stock.MaxQty) remaining and loaded. It
// returns an error wrapping stock.ErrLoaded if the item exists, and changes nothing then.
func (s *Store) Load(ctx context.Context, sku string, qty int64) error {
	if err := checkName("sku", sku); err != nil {
		return err
	}
	if qty < 0 || qty > stock.MaxQty {
		return invalid("load quantity %d out of range [0, %d]", qty, stock.MaxQty)
	}
	res, err := s.db.ExecContext(ctx, s.q.load, sku, qty, qty)
	if isDuplicate(err) {
		return fmt.Errorf("sqlstore: %w: %q", stock.ErrLoaded, sku)
	}
	if err != nil {
		return fmt.Errorf("sqlstore: load %q: %w", sku, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("sqlstore: load %q: %w", sku, err)
	} else if n == 0 {
		return fmt.Errorf("sqlstore: %w: %q", stock.ErrLoaded, sku)
	}
	return nil
}

// Remaining returns the remaining stock of sku; an error wrapping stock.ErrNotLoaded if the
// item has no row.
func (s *Store) Remaining(ctx context.Context, sku string) (int64, error) {
	if err := checkName("sku", sku); err != nil {
		return 0, err
	}
	var n int64
	err := s.db.QueryRowContext(ctx, s.q.remaining, sku).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("sqlstore: %w: %q", stock.ErrNotLoaded, sku)
	}
	if err != nil {
		return 0, fmt.Errorf("sqlstore: remaining %q: %w", sku, err)
	}
	return n, nil
}

// Apply applies one event as the stock.Store contract says (see the package doc for how).
// Invalid input returns an error wrapping stock.ErrInvalid and writes nothing; a deduct or
// confirm the stock does not cover, now or when first applied, an error wrapping
// stock.ErrRefused. Any other error leaves the outcome unknown: apply the event again.
func (s *Store) Apply(ctx context.Context, ev stock.Event) error {
	if ok, err := checkEvent(ev); !ok {
		return err
	}
	var out error
	err := s.inTx(ctx, func(tx *sql.Tx) (err error) {
		out, err = s.apply(ctx, tx, ev)
		return err
	})
	if err != nil {
		return fmt.Errorf("sqlstore: apply %s %q/%q: %w", ev.Type, ev.SKU, ev.ID, err)
	}
	return out
}

// apply applies ev in tx. out is the event's outcome (nil, ErrRefused, ErrNotLoaded), to be
// committed; err a database error that aborts the transaction.
func (s *Store) apply(ctx context.Context, tx *sql.Tx, ev stock.Event) (out, err error) {
	switch ev.Type {
	case stock.EventDeducted, stock.EventConfirmed:
		return s.take(ctx, tx, ev)
	case stock.EventRestored, stock.EventRefused:
		return nil, s.giveBack(ctx, tx, ev)
	default: // stock.EventRestocked
		return s.restock(ctx, tx, ev)
	}
}

func (s *Store) take(ctx context.Context, tx *sql.Tx, ev stock.Event) (out, err error) {
	if ok, err := s.insert(ctx, tx, ev, stock.StateApplied); err != nil || !ok {
		return s.answer(ctx, tx, ev, err)
	}
	n, err := affected(tx.ExecContext(ctx, s.q.take, ev.Qty, ev.SKU, ev.Qty))
	if err != nil || n == 1 {
		return nil, err
	}
	var rem int64
	if err := tx.QueryRowContext(ctx, s.q.remaining, ev.SKU).Scan(&rem); errors.Is(err, sql.ErrNoRows) {
		// The item has no row: a setup error, not a refusal. Nothing is recorded, and the
		// relay keeps the event until the item is loaded.
		if _, err := tx.ExecContext(ctx, s.q.drop, ev.SKU, ev.ID); err != nil {
			return nil, err
		}
		return fmt.Errorf("sqlstore: %s %q of %q: %w", ev.Type, ev.ID, ev.SKU, stock.ErrNotLoaded), nil
	} else if err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, s.q.refuse, ev.SKU, ev.ID); err != nil {
		return nil, err
	}
	return refused(ev), nil
}

// giveBack undoes the deduct or confirm of ev.ID if it is applied, or leaves a tombstone if
// the id has no record.
func (s *Store) giveBack(ctx context.Context, tx *sql.Tx, ev stock.Event) error {
	// The first pass finds no applied record if there is none or a concurrent deduct of the
	// id has not committed yet; the insert then waits for that deduct, and the second pass
	// restores it. Restoring before inserting keeps the common case (restore of an applied
	// deduct) to one row lock, with no shared-to-exclusive upgrade for MySQL to deadlock on.
	for range 2 {
		n, err := affected(tx.ExecContext(ctx, s.q.restore, ev.SKU, ev.ID))
		if err != nil {
			return err
		}
		if n == 1 {
			n, err := affected(tx.ExecContext(ctx, s.q.giveBack, ev.SKU, ev.ID, ev.SKU))
			if err == nil && n != 1 {
				err = fmt.Errorf("item %q has no row to give %q back to", ev.SKU, ev.ID)
			}
			return err
		}
		ok, err := s.insert(ctx, tx, ev, stock.StateRestored)
		if err != nil || ok {
			return err
		}
		st, typ, err := s.status(ctx, tx, ev)
		if err != nil || st != stock.StateApplied || (typ != stock.EventDeducted && typ != stock.EventConfirmed) {
			return err
		}
	}
	return errors.New("record changed during restore")
}

func (s *Store) restock(ctx context.Context, tx *sql.Tx, ev stock.Event) (out, err error) {
	if ok, err := s.insert(ctx, tx, ev, stock.StateApplied); err != nil || !ok {
		return s.answer(ctx, tx, ev, err)
	}
	n, err := affected(tx.ExecContext(ctx, s.q.restock, ev.Qty, ev.Qty, ev.SKU))
	if err != nil || n == 1 {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, s.q.drop, ev.SKU, ev.ID); err != nil {
		return nil, err
	}
	return fmt.Errorf("sqlstore: restock %q of %q: %w", ev.ID, ev.SKU, stock.ErrNotLoaded), nil
}

// insert inserts ev's record with status st; false if (sku, id) already has one.
func (s *Store) insert(ctx context.Context, tx *sql.Tx, ev stock.Event, st stock.State) (bool, error) {
	n, err := affected(tx.ExecContext(ctx, s.q.insert, ev.SKU, ev.ID, ev.User, string(ev.Type), ev.Qty, string(st)))
	if isDuplicate(err) {
		return false, nil
	}
	return n == 1, err
}

// answer answers ev as its existing record says; err is passed through.
func (s *Store) answer(ctx context.Context, tx *sql.Tx, ev stock.Event, err error) (out, _ error) {
	if err != nil {
		return nil, err
	}
	st, _, err := s.status(ctx, tx, ev)
	if err != nil || st != stock.StateRefused {
		return nil, err
	}
	return refused(ev), nil
}

// status reads the record of ev's id. Transactions run in READ COMMITTED (or serialized, on
// SQLite), so a plain read sees the record a conflicting insert just waited for.
func (s *Store) status(ctx context.Context, tx *sql.Tx, ev stock.Event) (stock.State, stock.EventType, error) {
	var st, typ string
	err := tx.QueryRowContext(ctx, s.q.status, ev.SKU, ev.ID).Scan(&st, &typ)
	if errors.Is(err, sql.ErrNoRows) {
		err = fmt.Errorf("record %q of %q vanished", ev.ID, ev.SKU)
	}
	return stock.State(st), stock.EventType(typ), err
}

// inTx runs fn in a transaction and commits it, retrying the whole transaction when it fails
// with a retryable error.
func (s *Store) inTx(ctx context.Context, fn func(*sql.Tx) error) error {
	var opts *sql.TxOptions
	if s.d != SQLite {
		opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	for attempt := 1; ; attempt++ {
		err := s.tryTx(ctx, opts, fn)
		if err == nil || attempt == maxAttempts || !retryable(err) {
			return err
		}
		// Full jitter on an exponential ceiling from 1 ms to 64 ms.
		d := time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt-1, 6)))
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

func (s *Store) tryTx(ctx context.Context, opts *sql.TxOptions, fn func(*sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// Records returns the records of the given ids of sku; ids with no record are absent.
func (s *Store) Records(ctx context.Context, sku string, ids []string) (map[string]stock.Record, error) {
	if err := checkName("sku", sku); err != nil {
		return nil, err
	}
	for _, id := range ids {
		if err := checkName("id", id); err != nil {
			return nil, err
		}
	}
	m := make(map[string]stock.Record, len(ids))
	if err := s.records(ctx, s.db, sku, ids, func(r stock.Record) { m[r.ID] = r }); err != nil {
		return nil, fmt.Errorf("sqlstore: records of %q: %w", sku, err)
	}
	return m, nil
}

// querier is a *sql.DB or a *sql.Tx.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// records calls fn with each record of the given ids of sku.
func (s *Store) records(ctx context.Context, db querier, sku string, ids []string, fn func(stock.Record)) error {
	if s.d == Postgres {
		return s.query(ctx, db, s.q.records, []any{ids, sku}, fn)
	}
	for chunk := range slices.Chunk(ids, recordsPage) {
		args := make([]any, 0, len(chunk)+1)
		args = append(args, sku)
		for _, id := range chunk {
			args = append(args, id)
		}
		if err := s.query(ctx, db, s.q.records+placeholders(len(chunk))+")", args, fn); err != nil {
			return err
		}
	}
	return nil
}

// List returns up to limit records of sku whose id is greater than after, in id order (byte
// order). after is "" for the first page; limit must be positive.
func (s *Store) List(ctx context.Context, sku, after string, limit int) ([]stock.Record, error) {
	if err := checkName("sku", sku); err != nil {
		return nil, err
	}
	if limit <= 0 {
		return nil, invalid("list limit %d is not positive", limit)
	}
	var out []stock.Record
	if err := s.query(ctx, s.db, s.q.list, []any{sku, after, limit}, func(r stock.Record) { out = append(out, r) }); err != nil {
		return nil, fmt.Errorf("sqlstore: list %q: %w", sku, err)
	}
	return out, nil
}

// query runs a query of record columns and calls fn with each record.
func (s *Store) query(ctx context.Context, db querier, q string, args []any, fn func(stock.Record)) error {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			r       stock.Record
			typ, st string
			at      = dbTime{wall: s.d != Postgres}
		)
		if err := rows.Scan(&r.SKU, &r.ID, &r.User, &typ, &r.Qty, &st, &at); err != nil {
			return err
		}
		r.Type, r.Status, r.At = stock.EventType(typ), stock.State(st), at.t
		fn(r)
	}
	return rows.Err()
}

// dbTime scans a timestamp column into a UTC time: an instant (PostgreSQL's TIMESTAMPTZ), a
// wall-clock time.Time whose wall clock is UTC whatever zone the driver gave it (MySQL with
// parseTime=true), or text (SQLite; MySQL without parseTime).
type dbTime struct {
	t    time.Time
	wall bool // a time.Time's wall clock is UTC
}

// Scan implements sql.Scanner for the time types the drivers return.
func (d *dbTime) Scan(v any) error {
	switch v := v.(type) {
	case time.Time:
		if d.wall {
			v = time.Date(v.Year(), v.Month(), v.Day(), v.Hour(), v.Minute(), v.Second(), v.Nanosecond(), time.UTC)
		}
		d.t = v.UTC()
		return nil
	case []byte:
		return d.parse(string(v))
	case string:
		return d.parse(v)
	}
	return fmt.Errorf("sqlstore: cannot scan %T into a time", v)
}

func (d *dbTime) parse(s string) (err error) {
	d.t, err = time.Parse("2006-01-02 15:04:05.999999999", s)
	return err
}

func affected(res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func refused(ev stock.Event) error {
	return fmt.Errorf("sqlstore: %w: %s %q of %q for %d units", stock.ErrRefused, ev.Type, ev.ID, ev.SKU, ev.Qty)
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("sqlstore: %w: "+format, append([]any{stock.ErrInvalid}, args...)...)
}

// checkEvent validates ev. ok is false for an event Apply must not write: an invalid one (err
// says why) or one of a type a Store ignores (err is nil).
func checkEvent(ev stock.Event) (ok bool, err error) {
	switch ev.Type {
	case stock.EventDeducted, stock.EventConfirmed, stock.EventRestocked, stock.EventRestored, stock.EventRefused:
	case stock.EventHeld, stock.EventCancelled, stock.EventExpired:
		return false, nil
	default:
		return false, invalid("unknown event type %q", ev.Type)
	}
	if err := checkName("sku", ev.SKU); err != nil {
		return false, err
	}
	if err := checkName("id", ev.ID); err != nil {
		return false, err
	}
	if ev.User != "" {
		if err := checkName("user", ev.User); err != nil {
			return false, err
		}
	}
	if ev.Qty <= 0 || ev.Qty > stock.MaxQty {
		return false, invalid("quantity %d out of range [1, %d]", ev.Qty, stock.MaxQty)
	}
	return true, nil
}

// checkName accepts what every dialect stores and compares exactly: 1 to stock.MaxNameLen
// bytes of UTF-8 without control characters. It accepts more than the library's names (braces,
// '|', whitespace, Unicode format characters): a Store records what it is given, including the
// events of items named under earlier, looser rules, and a name the library sends always passes.
func checkName(what, v string) error {
	if v == "" {
		return invalid("empty %s", what)
	}
	if len(v) > stock.MaxNameLen {
		return invalid("%s longer than %d bytes", what, stock.MaxNameLen)
	}
	if !utf8.ValidString(v) {
		return invalid("%s is not valid UTF-8", what)
	}
	if strings.ContainsFunc(v, unicode.IsControl) {
		return invalid("%s %q contains a control character", what, v)
	}
	return nil
}
