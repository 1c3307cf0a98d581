// Package dburl parses the database URLs the tools and examples of this module accept (the
// -dsn flag of stockctl and flashsale) into a database/sql driver, its DSN and the sqlstore
// dialect, and opens them. It registers the drivers it names: pgx ("pgx"),
// go-sql-driver/mysql ("mysql") and modernc.org/sqlite ("sqlite").
//
// The forms:
//
//	postgres://... or postgresql://...   PostgreSQL through pgx, passed as is
//	mysql://user:pass@host:port/db?k=v    MySQL or MariaDB through go-sql-driver/mysql, turned
//	                                      into user:pass@tcp(host:port)/db?k=v (port 3306 by
//	                                      default; user and password URL-escaped)
//	mysql:DSN or mysql://DSN              go-sql-driver/mysql's own form, as is, for example
//	                                      mysql:root@tcp(127.0.0.1:3306)/test?parseTime=true
//	sqlite:PATH                           a SQLite file through modernc.org/sqlite, with a busy
//	                                      timeout, WAL and immediate transactions
//	sqlite:file:... or file:...           the sqlite driver's own form, as is
package dburl

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	_ "modernc.org/sqlite"             // registers "sqlite"

	"github.com/stockres/stock/sqlstore"
)

// Target is a parsed database URL.
type Target struct {
	Driver  string           // the database/sql driver name: "pgx", "mysql" or "sqlite"
	DSN     string           // the driver's own DSN
	Dialect sqlstore.Dialect // the sqlstore dialect
}

const want = "want postgres://..., mysql://user:pass@host:port/db, mysql:DSN or sqlite:PATH"

// Parse parses a database URL (see the package doc). Its errors never show a password.
func Parse(s string) (Target, error) {
	scheme, rest, ok := strings.Cut(s, ":")
	if !ok {
		return Target{}, fmt.Errorf("%q: %s", Redact(s), want)
	}
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		return Target{"pgx", s, sqlstore.Postgres}, nil
	case "mysql":
		if after, ok := strings.CutPrefix(rest, "//"); !ok || driverForm(after) {
			if !ok {
				after = rest
			}
			if _, err := mysql.ParseDSN(after); err != nil {
				return Target{}, fmt.Errorf("%q: %v", Redact(s), err)
			}
			return Target{"mysql", after, sqlstore.MySQL}, nil
		}
		dsn, err := mysqlDSN(s)
		return Target{"mysql", dsn, sqlstore.MySQL}, err
	case "sqlite", "sqlite3":
		if rest == "" {
			return Target{}, fmt.Errorf("%q: no file", s)
		}
		if strings.HasPrefix(rest, "file:") {
			return Target{"sqlite", rest, sqlstore.SQLite}, nil
		}
		return Target{"sqlite", "file:" + rest + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate", sqlstore.SQLite}, nil
	case "file":
		return Target{"sqlite", s, sqlstore.SQLite}, nil
	}
	return Target{}, fmt.Errorf("unknown database %q: %s", scheme, want)
}

// driverForm reports whether what follows mysql:// is go-sql-driver/mysql's own form
// (user@tcp(host:port)/db), which no URL host can be: a host has no parentheses.
func driverForm(s string) bool {
	host, _, _ := strings.Cut(s, "/")
	return strings.Contains(host, "(")
}

// mysqlDSN turns mysql://user:pass@host:port/db?params into the go-sql-driver form.
func mysqlDSN(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = errors.New(strings.ReplaceAll(ue.Err.Error(), s, Redact(s)))
		}
		return "", fmt.Errorf("%q: %v", Redact(s), err)
	}
	if u.Hostname() == "" {
		return "", fmt.Errorf("%q: no host", Redact(s))
	}
	cfg := mysql.NewConfig()
	cfg.Net, cfg.Addr = "tcp", u.Host
	if u.Port() == "" {
		cfg.Addr = net.JoinHostPort(u.Hostname(), "3306")
	}
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	dsn := cfg.FormatDSN()
	if u.RawQuery != "" {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		dsn += sep + u.RawQuery
	}
	if _, err := mysql.ParseDSN(dsn); err != nil {
		return "", fmt.Errorf("%q: %v", Redact(s), err)
	}
	return dsn, nil
}

// Open opens the database and checks that it answers.
func (t Target) Open(ctx context.Context) (*sql.DB, error) {
	var db *sql.DB
	if t.Driver == "mysql" {
		cfg, err := mysql.ParseDSN(t.DSN)
		if err != nil {
			return nil, err
		}
		conn, err := mysql.NewConnector(cfg)
		if err != nil {
			return nil, err
		}
		db = sql.OpenDB(conn)
	} else {
		var err error
		if db, err = sql.Open(t.Driver, t.DSN); err != nil {
			return nil, err
		}
	}
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, err
	}
	return db, nil
}

// Redact hides the password of a database URL, in either the URL form or go-sql-driver's own
// form (user:pass@tcp(...)), for messages.
func Redact(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
		return u.String()
	}
	at := strings.LastIndex(s, "@")
	if at < 0 {
		return s
	}
	head := s[:at]
	start := strings.Index(head, "://") + 3
	if start < 3 {
		start = strings.Index(head, ":") + 1 // mysql:user:pass@...
	}
	if colon := strings.Index(head[start:], ":"); colon >= 0 {
		return head[:start+colon] + ":xxxxx" + s[at:]
	}
	return s
}
