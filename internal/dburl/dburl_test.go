package dburl

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/stockres/stock/sqlstore"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in, driver, dsn string
		d               sqlstore.Dialect
	}{
		{"postgres://app@db:5432/shop?sslmode=disable", "pgx", "postgres://app@db:5432/shop?sslmode=disable", sqlstore.Postgres},
		{"postgresql://app@db/shop", "pgx", "postgresql://app@db/shop", sqlstore.Postgres},
		{"mysql://app:s%40cret@db/shop?parseTime=true&interpolateParams=true", "mysql", "app:s@cret@tcp(db:3306)/shop?parseTime=true&interpolateParams=true", sqlstore.MySQL},
		{"mysql://root@127.0.0.1:3306/test", "mysql", "root@tcp(127.0.0.1:3306)/test", sqlstore.MySQL},
		{"mysql://root@127.0.0.1:3307/test", "mysql", "root@tcp(127.0.0.1:3307)/test", sqlstore.MySQL},
		{"mysql:root@tcp(127.0.0.1:3306)/test?parseTime=true", "mysql", "root@tcp(127.0.0.1:3306)/test?parseTime=true", sqlstore.MySQL},
		{"mysql://root@tcp(127.0.0.1:3306)/test?interpolateParams=true", "mysql", "root@tcp(127.0.0.1:3306)/test?interpolateParams=true", sqlstore.MySQL},
		{"sqlite:/var/lib/shop.db", "sqlite", "file:/var/lib/shop.db?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate", sqlstore.SQLite},
		{"sqlite:file:x.db?mode=memory", "sqlite", "file:x.db?mode=memory", sqlstore.SQLite},
		{"file:x.db", "sqlite", "file:x.db", sqlstore.SQLite},
	} {
		got, err := Parse(tc.in)
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		if want := (Target{tc.driver, tc.dsn, tc.d}); got != want {
			t.Errorf("%s: %+v, want %+v", tc.in, got, want)
		}
	}
	for _, bad := range []string{"nothing", "oracle://x", "sqlite:", "mysql://:pw@/db", "mysql://u:secret@db:x/shop"} {
		_, err := Parse(bad)
		if err == nil {
			t.Errorf("%s: no error", bad)
		} else if strings.Contains(err.Error(), "secret") || strings.Contains(err.Error(), ":pw@") {
			t.Errorf("%s: the error shows the password: %v", bad, err)
		}
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"mysql://app:secret@db/shop":            "mysql://app:xxxxx@db/shop",
		"postgres://app@db/shop":                "postgres://app@db/shop",
		"mysql:root:secret@tcp(db:3306)/shop":   "mysql:root:xxxxx@tcp(db:3306)/shop",
		"mysql://root:secret@tcp(db:3306)/shop": "mysql://root:xxxxx@tcp(db:3306)/shop",
		"sqlite:/var/lib/shop.db":               "sqlite:/var/lib/shop.db",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestOpenMySQLURL opens MariaDB by the URL form that flashsale refused ("default addr for
// network '127.0.0.1:3306' unknown") when STOCK_TEST_MYSQL names a server on 127.0.0.1:3306.
func TestOpenMySQLURL(t *testing.T) {
	if os.Getenv("STOCK_TEST_MYSQL") == "" {
		t.Skip("STOCK_TEST_MYSQL is not set: no MySQL server to open")
	}
	tg, err := Parse("mysql://root@127.0.0.1:3306/test")
	if err != nil {
		t.Fatal(err)
	}
	db, err := tg.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
}
