package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-sql-driver/mysql"
)

// MySQLError has the name and field of the driver's error but another package path: it must
// not be taken for the driver's.
type MySQLError struct{ Number uint16 }

func (e *MySQLError) Error() string { return fmt.Sprintf("Error %d", e.Number) }

// TestMySQLErrorNumber reads the driver's error number through wrapping, without importing
// the driver outside tests.
func TestMySQLErrorNumber(t *testing.T) {
	dup := &mysql.MySQLError{Number: 1062, Message: "Duplicate entry"}
	var nilErr *mysql.MySQLError
	for _, c := range []struct {
		name string
		err  error
		n    uint16
		ok   bool
	}{
		{"nil", nil, 0, false},
		{"plain", dup, 1062, true},
		{"wrapped", fmt.Errorf("apply: %w", fmt.Errorf("insert: %w", dup)), 1062, true},
		{"joined", errors.Join(errors.New("other"), dup), 1062, true},
		{"in a joined wrap", fmt.Errorf("x: %w", errors.Join(errors.New("a"), fmt.Errorf("b: %w", dup))), 1062, true},
		{"deadlock", &mysql.MySQLError{Number: 1213}, 1213, true},
		{"typed nil", nilErr, 0, false},
		{"look-alike of another package", &MySQLError{Number: 1062}, 0, false},
		{"its text only", errors.New("Error 1062 (23000): Duplicate entry"), 0, false},
		{"another error", sql.ErrNoRows, 0, false},
	} {
		n, ok := mysqlErrorNumber(c.err)
		if n != c.n || ok != c.ok {
			t.Errorf("%s: mysqlErrorNumber = %d, %v; want %d, %v", c.name, n, ok, c.n, c.ok)
		}
	}
	if !isDuplicate(fmt.Errorf("w: %w", dup)) || isDuplicate(&mysql.MySQLError{Number: 1213}) {
		t.Error("isDuplicate: wrong answer")
	}
	if !retryable(&mysql.MySQLError{Number: 1213}) || !retryable(&mysql.MySQLError{Number: 1205}) || retryable(dup) {
		t.Error("retryable: wrong answer")
	}
}

// TestMySQLErrorsOnServer checks the detection on the errors a real MariaDB/MySQL server
// returns: a duplicate key (1062) and a deadlock (1213).
func TestMySQLErrorsOnServer(t *testing.T) {
	dsn := os.Getenv("STOCK_TEST_MYSQL")
	if dsn == "" {
		t.Skip("needs MariaDB/MySQL: set STOCK_TEST_MYSQL")
	}
	db, err := sql.Open("mysql", dsn)
	require.NoError(t, err)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tbl := fmt.Sprintf("stock_t%08x_errs", rand.Uint32())
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+tbl+" (id INT PRIMARY KEY, v INT) ENGINE=InnoDB"); err != nil {
		t.Fatalf("server unreachable or refused: %v", err) // a configured server must be there
	}
	defer db.Exec("DROP TABLE IF EXISTS " + tbl)
	if _, err := db.ExecContext(ctx, "INSERT INTO "+tbl+" VALUES (1, 0), (2, 0)"); err != nil {
		t.Fatal(err)
	}

	_, err = db.ExecContext(ctx, "INSERT INTO "+tbl+" VALUES (1, 0)")
	if !isDuplicate(fmt.Errorf("insert: %w", err)) || retryable(err) {
		t.Fatalf("duplicate key: isDuplicate false or retryable true for %v", err)
	}

	// Two transactions lock rows 1 and 2 in opposite orders: the server aborts one with 1213.
	var txs [2]*sql.Tx
	for i := range txs {
		if txs[i], err = db.BeginTx(ctx, nil); err != nil {
			t.Fatal(err)
		}
		defer txs[i].Rollback()
		if _, err := txs[i].ExecContext(ctx, "UPDATE "+tbl+" SET v = v + 1 WHERE id = ?", i+1); err != nil {
			t.Fatal(err)
		}
	}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range txs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = txs[i].ExecContext(ctx, "UPDATE "+tbl+" SET v = v + 1 WHERE id = ?", 2-i)
			if errs[i] != nil {
				txs[i].Rollback() // release the locks the other transaction waits for
			}
		}()
	}
	wg.Wait()
	got := 0
	for _, err := range errs {
		if err == nil {
			continue
		}
		if n, _ := mysqlErrorNumber(err); n != 1213 || !retryable(err) || isDuplicate(err) {
			t.Fatalf("deadlock: number %d, retryable %v for %v", n, retryable(err), err)
		}
		got++
	}
	if got == 0 {
		t.Fatal("no deadlock reported")
	}
}
