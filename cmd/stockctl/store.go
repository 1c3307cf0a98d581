package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // "pgx"
	"github.com/redis/rueidis"
	_ "modernc.org/sqlite" // "sqlite"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/dburl"
	"github.com/stockres/stock/internal/redisaddr"
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

// redisOption turns -redis into a client option, by the parser the tools share
// (internal/redisaddr): a redis://, rediss:// (TLS) or unix:// URL, with the user and password
// of an ACL user in it, or a comma-separated list of addresses. Client-side caching is off (an operator's reads must be
// fresh); with one address rueidis finds out whether it is a cluster node.
func redisOption(s string, timeout time.Duration) (rueidis.ClientOption, error) {
	opt, err := redisaddr.Parse(s)
	if err != nil {
		return opt, usagef("-redis %v", err)
	}
	opt.DisableCache = true
	opt.Dialer.Timeout = min(timeout, 10*time.Second)
	return opt, nil
}

// sentinelOption turns -sentinel (name@host:port,...) into the options of a rueidis Sentinel
// client, which asks the sentinels for the primary and follows a failover. Client-side caching
// is off, as with -redis.
func sentinelOption(s string, timeout time.Duration) (rueidis.ClientOption, error) {
	opt, err := redisaddr.ParseSentinel(s)
	if err != nil {
		return opt, usagef("-sentinel %v", err)
	}
	opt.DisableCache = true
	opt.Dialer.Timeout = min(timeout, 10*time.Second)
	opt.Sentinel.Dialer.Timeout = opt.Dialer.Timeout
	return opt, nil
}

// reserver connects to Redis.
func (e *env) reserver() (*stock.Reserver, error) {
	if e.r != nil {
		return e.r, nil
	}
	opt, err := redisOption(e.g.redis, e.g.timeout)
	where := redisaddr.Redact(e.g.redis) // the address, never its password
	if e.g.sentinel != "" {
		opt, err = sentinelOption(e.g.sentinel, e.g.timeout)
		where = "the primary of Sentinel " + redactURLs(e.g.sentinel)
	}
	if err != nil {
		return nil, err
	}
	c, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, fmt.Errorf("connect to Redis at %s: %w", where, err)
	}
	r, err := stock.New(c, stock.WithPrefix(e.g.prefix))
	if err != nil {
		c.Close()
		return nil, usagef("-prefix: %v", err)
	}
	e.client, e.r = c, r
	return r, nil
}

// needDSN is the usage error of a command that needs -dsn without it: commands that need it
// call it before they connect to anything.
func (e *env) needDSN(why string) error {
	if e.g.dsn == "" {
		return usagef("%s needs the database of record: -dsn", why)
	}
	return nil
}

// reserverAndStore connects to Redis and opens the database of -dsn, for a command (why) that
// needs both; without -dsn it is a usage error, before connecting to anything.
func (e *env) reserverAndStore(ctx context.Context, why string) (*stock.Reserver, *sqlstore.Store, error) {
	if err := e.needDSN(why); err != nil {
		return nil, nil, err
	}
	r, err := e.reserver()
	if err != nil {
		return nil, nil, err
	}
	st, err := e.openStore(ctx, why)
	if err != nil {
		return nil, nil, err
	}
	return r, st, nil
}

// openStore opens the database of -dsn; it is a usage error when -dsn is not set and
// required.
func (e *env) openStore(ctx context.Context, why string) (*sqlstore.Store, error) {
	if e.store != nil {
		return e.store, nil
	}
	if err := e.needDSN(why); err != nil {
		return nil, err
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

// parseDSN maps -dsn to a database/sql driver, its DSN and the sqlstore dialect, by the
// parser every tool of the module shares (internal/dburl: postgres://..., mysql://...,
// mysql:DSN, sqlite:PATH).
func parseDSN(s string) (driver, dsn string, d sqlstore.Dialect, err error) {
	t, err := dburl.Parse(s)
	if err != nil {
		return "", "", 0, usagef("-dsn %v", err)
	}
	return t.Driver, t.DSN, t.Dialect, nil
}

// redact hides the password of a DSN in messages.
func redact(s string) string { return dburl.Redact(s) }

// userinfo matches the user and password of a URL (scheme://user:password@).
var userinfo = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://[^\s/@:"']*):([^\s/@"']*)@`)

// redactURLs hides the password of every URL in s.
func redactURLs(s string) string { return userinfo.ReplaceAllString(s, "${1}:xxxxx@") }

// hideSecrets hides in a message the passwords of -redis, -sentinel and -dsn: in any URL that
// carries one, and anywhere else (an error of a driver or client quoting its input) when it is
// at least 4 characters long, so as not to mangle the message. stockctl's messages go to cron
// mail and logs; the addresses it prints itself are redacted where it prints them, and this is
// the net under that.
func hideSecrets(msg string, g globals) string {
	pws := passwords(g)
	if len(pws) == 0 {
		return msg
	}
	msg = userinfo.ReplaceAllStringFunc(msg, func(m string) string {
		if sub := userinfo.FindStringSubmatch(m); sub != nil && slices.Contains(pws, sub[2]) {
			return sub[1] + ":xxxxx@"
		}
		return m
	})
	for _, pw := range pws {
		if len(pw) >= 4 {
			msg = strings.ReplaceAll(msg, pw, "xxxxx")
		}
	}
	return msg
}

// passwords returns the passwords in g's addresses, as given (URL-escaped) and unescaped.
func passwords(g globals) []string {
	var out []string
	add := func(pw string) {
		if pw == "" {
			return
		}
		out = append(out, pw)
		if un, err := url.PathUnescape(pw); err == nil && un != pw {
			out = append(out, un)
		}
		if un, err := url.QueryUnescape(pw); err == nil && un != pw {
			out = append(out, un)
		}
	}
	for _, s := range []string{g.redis, g.sentinel, g.dsn} {
		add(urlPassword(s))
	}
	if opt, err := redisaddr.Parse(g.redis); err == nil {
		add(opt.Password)
	}
	if t, err := dburl.Parse(g.dsn); err == nil && t.Driver == "mysql" {
		if cfg, err := mysql.ParseDSN(t.DSN); err == nil {
			add(cfg.Passwd)
		}
	}
	return out
}

// urlPassword returns the password of the first scheme://user:password@ in s, as written.
func urlPassword(s string) string {
	i := strings.Index(s, "://")
	if i < 0 {
		return ""
	}
	auth := s[i+3:]
	if j := strings.IndexAny(auth, "/?#"); j >= 0 {
		auth = auth[:j]
	}
	at := strings.LastIndex(auth, "@")
	if at < 0 {
		return ""
	}
	_, pw, ok := strings.Cut(auth[:at], ":")
	if !ok {
		return ""
	}
	return pw
}
