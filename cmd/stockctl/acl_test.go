package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/redistest"
)

// cliACL is the ACL of an operator's stockctl user on one prefix, as the README documents it:
// the items' keys and the registry; the scripts and the commands they run; the reads; no
// client-side caching (stockctl reads fresh), no replica ack, no failover guard, no carts; the
// epoch key and INFO, so that reconcile -apply records the primaries and lifts the fences.
func cliACL(user, password, prefix string) []string {
	args := []string{user, "reset", "on", ">" + password, "resetchannels",
		"~" + prefix + ":{*", "~" + prefix + ":items", "~" + prefix + ":due{~*", "~" + prefix + ":holdsdue{~*",
		"~" + prefix + ":epoch", "-@all", "+ping", "+info", "+cluster|slots", "+cluster|shards", "+evalsha", "+eval",
		"+get", "+set", "+del", "+exists", "+pexpire", "+setbit", "+time",
		"+hget", "+hmget", "+hset", "+hsetnx", "+hdel", "+hexists", "+hincrby", "+hscan",
		"+zadd", "+zrem", "+zcard", "+zcount", "+zrange", "+zrangebyscore", "+zscore",
		"+sadd", "+srem", "+sscan", "+sismember"}
	var out []string
	for _, a := range args {
		if a != os.Getenv("ACL_DROP") {
			out = append(out, a)
		}
	}
	return out
}

// TestOperatorACL runs every stockctl command as a Redis user with only the documented
// operator ACL, reached by a redis://user:password@host URL, and checks that this user cannot
// read or change another prefix's items.
func TestOperatorACL(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skip("STOCK_REDIS_SERVER is not set: ACLs need a real Redis")
	}
	s := redistest.StartServer(t)
	ctx := context.Background()
	admin := serverClient(t, s.Addr())
	require.NoError(t, admin.Do(ctx, admin.B().Arbitrary("ACL", "SETUSER").Args(cliACL("shop-ops", "p@ss", "shop")...).Build()).Error())
	other, err := stock.New(admin, stock.WithPrefix("other"))
	require.NoError(t, err)
	require.NoError(t, other.Load(ctx, "A", 5))
	lib, err := stock.New(admin, stock.WithPrefix("shop"), stock.WithOutbox(true))
	require.NoError(t, err)

	url := "redis://shop-ops:p%40ss@" + s.Addr()
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "stock.db")
	stockctl := func(args ...string) (int, string) {
		res := runCLI(t, append([]string{"-redis", url, "-dsn", dsn, "-timeout", "20s"}, args...)...)
		return res.code, res.out + res.err
	}
	for _, args := range [][]string{
		{"-prefix", "shop", "migrate"},
		{"-prefix", "shop", "load", "A", "10"},
		{"-prefix", "shop", "restock", "A", "po-1", "5"},
		{"-prefix", "shop", "available", "A"},
		{"-prefix", "shop", "levels"},
		{"-prefix", "shop", "items"},
		{"deduct by the service"},
		{"-prefix", "shop", "entry", "A", "o1"},
		{"-prefix", "shop", "ledger", "A"},
		{"-prefix", "shop", "restore", "A", "o1"},
		{"-prefix", "shop", "sweep"},
		{"-prefix", "shop", "close", "A"},
		{"-prefix", "shop", "reopen", "A"},
		{"-prefix", "shop", "relay-once"},
		{"-prefix", "shop", "reconcile", "-apply"},
	} {
		if args[0] == "deduct by the service" {
			_, err := lib.Deduct(ctx, stock.Request{SKU: "A", ID: "o1", Qty: 2})
			require.NoError(t, err)
			_, err = lib.Hold(ctx, stock.Request{SKU: "A", ID: "h1", Qty: 1}, time.Millisecond)
			require.NoError(t, err)
			time.Sleep(20 * time.Millisecond) // the hold expires: sweep releases it
			continue
		}
		code, out := stockctl(args...)
		assert.Equal(t, exitOK, code, "stockctl %s: %s", strings.Join(args, " "), out)
		if args[len(args)-1] == "-apply" {
			assert.NotContains(t, out, "fences stay", "a complete repairing pass records the primaries: it lifts every fence")
		}
	}
	lv, err := lib.Levels(ctx, "A")
	require.NoError(t, err)
	assert.Equal(t, stock.Levels{Available: 15, Loaded: 15}, lv, "restored and swept by the operator")
	// An item loaded in Redis only gets its store side; delist ends a sale.
	require.NoError(t, lib.Load(ctx, "B", 3))
	for _, args := range [][]string{{"load", "B", "3"}, {"reconcile", "-apply"}, {"delist", "A"}} {
		code, out := stockctl(append([]string{"-prefix", "shop"}, args...)...)
		assert.Equal(t, exitOK, code, "stockctl %s: %s", strings.Join(args, " "), out)
	}
	lv, err = lib.Levels(ctx, "A")
	require.NoError(t, err)
	assert.True(t, lv.Closed, "delisted")

	// Another prefix: refused, untouched.
	for _, args := range [][]string{{"levels", "A"}, {"items"}, {"restore", "A", "x"}, {"close", "A"}, {"load", "B", "1"}} {
		code, out := stockctl(append([]string{"-prefix", "other"}, args...)...)
		assert.NotEqual(t, exitOK, code, "stockctl -prefix other %s: %s", strings.Join(args, " "), out)
		assert.Contains(t, out, "NOPERM", args)
	}
	lv, err = other.Levels(ctx, "A")
	require.NoError(t, err)
	assert.Equal(t, stock.Levels{Available: 5, Loaded: 5}, lv)
}

// docs/operating.md documents the same operator ACL as TestOperatorACL runs.
func TestOperatorACLDocumented(t *testing.T) {
	readme, err := os.ReadFile("../../docs/operating.md")
	require.NoError(t, err)
	doc := strings.Join(strings.Fields(string(readme)), " ")
	assert.Contains(t, doc, "ACL SETUSER "+strings.Join(cliACL("shop-ops", "PASSWORD", "shop"), " "))
}
