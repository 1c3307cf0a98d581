package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // "pgx"
	"github.com/redis/rueidis"
	_ "modernc.org/sqlite" // "sqlite"

	"github.com/stockres/stock"
	"github.com/stockres/stock/sqlstore"
)

// env holds the connections of one run, opened on first use.
type env struct {
	g      globals
	out    io.Writer
	errOut io.Writer

	client rueidis.Client
	r      *stock.Reserver
	db     *sql.DB
	store  *sqlstore.Store
}

func (e *env) close() {
	if e.client != nil {
		e.client.Close()
	}
	if e.db != nil {
		_ = e.db.Close()
	}
}

// redisOption turns -redis into a client option: a redis://, rediss:// or unix:// URL, or a
// comma-separated list of addresses. Client-side caching is off (an operator's reads must be
// fresh); with one address rueidis finds out whether it is a cluster node.
func redisOption(s string, timeout time.Duration) (rueidis.ClientOption, error) {
	var opt rueidis.ClientOption
	s = strings.TrimSpace(s)
	if strings.Contains(s, "://") {
		o, err := rueidis.ParseURL(s)
		if err != nil {
			return opt, usagef("-redis %q: %v", s, err)
		}
		opt = o
	} else {
		for _, a := range strings.Split(s, ",") {
			a = strings.TrimSpace(a)
			if a == "" {
				continue
			}
			if _, _, err := net.SplitHostPort(a); err != nil {
				return opt, usagef("-redis %q: %v (want host:port)", a, err)
			}
			opt.InitAddress = append(opt.InitAddress, a)
		}
		if len(opt.InitAddress) == 0 {
			return opt, usagef("-redis: no address")
		}
	}
	opt.DisableCache = true
	opt.Dialer.Timeout = min(timeout, 10*time.Second)
	return opt, nil
}

// reserver connects to Redis.
func (e *env) reserver() (*stock.Reserver, error) {
	if e.r != nil {
		return e.r, nil
	}
	opt, err := redisOption(e.g.redis, e.g.timeout)
	if err != nil {
		return nil, err
	}
	c, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, fmt.Errorf("connect to Redis at %s: %w", e.g.redis, err)
	}
	r, err := stock.New(c, stock.WithPrefix(e.g.prefix))
	if err != nil {
		c.Close()
		return nil, usagef("-prefix: %v", err)
	}
	e.client, e.r = c, r
	return r, nil
}

// openStore opens the database of -dsn; it is a usage error when -dsn is not set and
// required.
func (e *env) openStore(ctx context.Context, why string) (*sqlstore.Store, error) {
	if e.store != nil {
		return e.store, nil
	}
	if e.g.dsn == "" {
		return nil, usagef("%s needs the database of record: -dsn", why)
	}
	driver, dsn, dialect, err := parseDSN(e.g.dsn)
	if err != nil {
		return nil, err
	}
	var db *sql.DB
	if driver == "mysql" {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			return nil, usagef("-dsn: %v", err)
		}
		conn, err := mysql.NewConnector(cfg)
		if err != nil {
			return nil, usagef("-dsn: %v", err)
		}
		db = sql.OpenDB(conn)
	} else if db, err = sql.Open(driver, dsn); err != nil {
		return nil, usagef("-dsn: %v", err)
	}
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("connect to the %s database: %w", dialect, err)
	}
	st, err := sqlstore.New(db, dialect, sqlstore.WithTablePrefix(e.g.tablePrefix))
	if err != nil {
		_ = db.Close()
		return nil, usagef("-table-prefix: %v", err)
	}
	e.db, e.store = db, st
	return st, nil
}

// parseDSN maps -dsn to a database/sql driver, its DSN and the sqlstore dialect:
//
//	postgres://... or postgresql://...  pgx, as is
//	mysql://user:pass@host:port/db?k=v  go-sql-driver/mysql: user:pass@tcp(host:port)/db?k=v
//	mysql:user:pass@tcp(host)/db        go-sql-driver/mysql, as is
//	sqlite:PATH                         modernc.org/sqlite, with a busy timeout, WAL and
//	                                    immediate transactions (sqlite:file:... is kept as is)
func parseDSN(s string) (driver, dsn string, d sqlstore.Dialect, err error) {
	scheme, rest, ok := strings.Cut(s, ":")
	if !ok {
		return "", "", 0, usagef("-dsn %q: want postgres://..., mysql://..., mysql:DSN or sqlite:PATH", redact(s))
	}
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		return "pgx", s, sqlstore.Postgres, nil
	case "mysql":
		if !strings.HasPrefix(rest, "//") {
			return "mysql", rest, sqlstore.MySQL, nil
		}
		dsn, err := mysqlDSN(s)
		return "mysql", dsn, sqlstore.MySQL, err
	case "sqlite", "sqlite3":
		if rest == "" {
			return "", "", 0, usagef("-dsn %q: no file", s)
		}
		if strings.HasPrefix(rest, "file:") {
			return "sqlite", rest, sqlstore.SQLite, nil
		}
		return "sqlite", "file:" + rest + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate", sqlstore.SQLite, nil
	}
	return "", "", 0, usagef("-dsn: unknown database %q: want postgres://..., mysql://..., mysql:DSN or sqlite:PATH", scheme)
}

// mysqlDSN turns mysql://user:pass@host:port/db?params into the go-sql-driver form.
func mysqlDSN(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", usagef("-dsn: %v", redactErr(err, s))
	}
	if u.Host == "" {
		return "", usagef("-dsn %q: no host", redact(s))
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
		return "", usagef("-dsn %q: %v", redact(s), err)
	}
	return dsn, nil
}

// redact hides the password of a URL-shaped DSN in messages.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

func redactErr(err error, s string) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return errors.New(strings.ReplaceAll(ue.Err.Error(), s, redact(s)))
	}
	return err
}
