package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite"

	"github.com/stockres/stock"
	"github.com/stockres/stock/sqlstore"
)

// The embedded default: SQLite in one file, with a busy timeout, WAL and immediate
// transactions. For PostgreSQL open "pgx" (github.com/jackc/pgx/v5/stdlib) and pass
// sqlstore.Postgres; for MySQL open "mysql" (github.com/go-sql-driver/mysql) and pass
// sqlstore.MySQL.
func Example() {
	dir, err := os.MkdirTemp("", "sqlstore")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "stock.db")+
		"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	ctx := context.Background()
	store, err := sqlstore.New(db, sqlstore.SQLite)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if err := store.Load(ctx, "sku-1", 5); err != nil {
		log.Fatal(err)
	}

	deduct := stock.Event{Type: stock.EventDeducted, SKU: "sku-1", ID: "order-1", Qty: 3}
	fmt.Println(store.Apply(ctx, deduct))
	fmt.Println(store.Apply(ctx, deduct)) // a repeat takes nothing
	big := stock.Event{Type: stock.EventDeducted, SKU: "sku-1", ID: "order-2", Qty: 3}
	fmt.Println(errors.Is(store.Apply(ctx, big), stock.ErrRefused))
	n, _ := store.Remaining(ctx, "sku-1")
	fmt.Println("remaining", n)

	errs := store.ApplyBatch(ctx, []stock.Event{
		{Type: stock.EventRestored, SKU: "sku-1", ID: "order-1", Qty: 3},
		{Type: stock.EventConfirmed, SKU: "sku-1", ID: "hold-1", Qty: 4},
	})
	fmt.Println(errs)
	n, _ = store.Remaining(ctx, "sku-1")
	fmt.Println("remaining", n)
	recs, _ := store.Records(ctx, "sku-1", []string{"order-1", "order-2", "hold-1"})
	for _, id := range []string{"order-1", "order-2", "hold-1"} {
		fmt.Println(id, recs[id].Type, recs[id].Status)
	}
	// Output:
	// <nil>
	// <nil>
	// true
	// remaining 2
	// [<nil> <nil>]
	// remaining 1
	// order-1 deducted restored
	// order-2 deducted refused
	// hold-1 confirmed applied
}
