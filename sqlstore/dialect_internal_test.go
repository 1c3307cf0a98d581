package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
		assert.Equal(t, []any{c.n, c.ok}, []any{n, ok}, "%s: mysqlErrorNumber", c.name)
	}
	assert.True(t, isDuplicate(fmt.Errorf("w: %w", dup)) && !isDuplicate(&mysql.MySQLError{Number: 1213}), "isDuplicate")
	assert.True(t, retryable(&mysql.MySQLError{Number: 1213}) && retryable(&mysql.MySQLError{Number: 1205}) && !retryable(dup), "retryable")
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
	_, err = db.ExecContext(ctx, "INSERT INTO "+tbl+" VALUES (1, 0), (2, 0)")
	require.NoError(t, err)

	_, err = db.ExecContext(ctx, "INSERT INTO "+tbl+" VALUES (1, 0)")
	require.True(t, isDuplicate(fmt.Errorf("insert: %w", err)) && !retryable(err), "duplicate key: isDuplicate false or retryable true for %v", err)

	// Two transactions lock rows 1 and 2 in opposite orders: the server aborts one with 1213.
	var txs [2]*sql.Tx
	for i := range txs {
		txs[i], err = db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer txs[i].Rollback()
		_, err = txs[i].ExecContext(ctx, "UPDATE "+tbl+" SET v = v + 1 WHERE id = ?", i+1)
		require.NoError(t, err)
	}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range txs {
		wg.Go(func() {
			_, errs[i] = txs[i].ExecContext(ctx, "UPDATE "+tbl+" SET v = v + 1 WHERE id = ?", 2-i)
			if errs[i] != nil {
				txs[i].Rollback() // release the locks the other transaction waits for
			}
		})
	}
	wg.Wait()
	got := 0
	for _, err := range errs {
		if err == nil {
			continue
		}
		n, _ := mysqlErrorNumber(err)
		require.True(t, n == 1213 && retryable(err) && !isDuplicate(err), "deadlock: number %d, retryable %v for %v", n, retryable(err), err)
		got++
	}
	require.NotZero(t, got, "no deadlock reported")
}

// TestSchemaFiles checks the statements Migrate reads from the schema files: for every
// dialect, the items table's and the records table's, named with the Store's prefix in place
// of the files' default one. TestSchemaFilesMatchMigrate runs the files and Migrate on the
// databases.
func TestSchemaFiles(t *testing.T) {
	for _, d := range []Dialect{Postgres, MySQL, SQLite} {
		items, records := d.quote("x_items"), d.quote("x_records")
		stmts := d.schema(items, records)
		require.Len(t, stmts, 2, "%s", d)
		assert.True(t, strings.HasPrefix(stmts[0], "CREATE TABLE IF NOT EXISTS "+items+" (\n"), "%s: %s", d, stmts[0])
		assert.True(t, strings.HasPrefix(stmts[1], "CREATE TABLE IF NOT EXISTS "+records+" (\n"), "%s: %s", d, stmts[1])
		for _, stmt := range stmts {
			assert.NotContains(t, stmt, defaultPrefix, "%s", d)
			assert.NotContains(t, stmt, ";", "%s", d)
			assert.NotContains(t, stmt, "--", "%s", d)
		}
	}
}
