package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stockres/stock"
	"github.com/stockres/stock/sqlstore"
)

// Broken promise under test (issue 13 case 5): Migrate is safe to run
// concurrently from any number of processes (separate *sql.DB pools), on every
// dialect; afterwards the store works.
func TestAttack13ConcurrentMigrateSeparatePools(t *testing.T) {
	type target struct {
		name, driver, dsn string
		d                 sqlstore.Dialect
	}
	dir := t.TempDir()
	targets := []target{{"sqlite", "sqlite", "file:" + filepath.Join(dir, "m.db") + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate", sqlstore.SQLite}}
	if v := os.Getenv("STOCK_TEST_POSTGRES"); v != "" {
		targets = append(targets, target{"postgres", "pgx", v, sqlstore.Postgres})
	}
	if v := os.Getenv("STOCK_TEST_MYSQL"); v != "" {
		targets = append(targets, target{"mysql", "mysql", v, sqlstore.MySQL})
	}
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			ctx := context.Background()
			prefix := fmt.Sprintf("a13m%d_", time.Now().UnixNano()%1e9)
			const procs = 8
			var wg sync.WaitGroup
			errs := make([]error, procs)
			dbs := make([]*sql.DB, procs)
			for i := range dbs {
				db, err := sql.Open(tg.driver, tg.dsn)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { db.Close() })
				dbs[i] = db
			}
			start := make(chan struct{})
			for i := 0; i < procs; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					s, err := sqlstore.New(dbs[i], tg.d, sqlstore.WithTablePrefix(prefix))
					if err != nil {
						errs[i] = err
						return
					}
					<-start
					errs[i] = s.Migrate(ctx)
				}(i)
			}
			close(start)
			wg.Wait()
			t.Cleanup(func() {
				if tg.name != "sqlite" {
					dbs[0].Exec("DROP TABLE " + prefix + "records")
					dbs[0].Exec("DROP TABLE " + prefix + "items")
				}
			})
			for i, err := range errs {
				if err != nil {
					t.Errorf("process %d: Migrate: %v", i, err)
				}
			}
			s, _ := sqlstore.New(dbs[0], tg.d, sqlstore.WithTablePrefix(prefix))
			if err := s.Load(ctx, "m", 2); err != nil {
				t.Fatal(err)
			}
			if err := s.Apply(ctx, stock.Event{Type: stock.EventDeducted, SKU: "m", ID: "a", Qty: 1, Seq: 1, At: time.Now()}); err != nil {
				t.Fatal(err)
			}
			if rem, err := s.Remaining(ctx, "m"); err != nil || rem != 1 {
				t.Fatalf("remaining %d %v", rem, err)
			}
			// and again, concurrently, on existing tables
			for i := 0; i < procs; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					s, _ := sqlstore.New(dbs[i], tg.d, sqlstore.WithTablePrefix(prefix))
					errs[i] = s.Migrate(ctx)
				}(i)
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Errorf("process %d: second Migrate: %v", i, err)
				}
			}
		})
	}
}
