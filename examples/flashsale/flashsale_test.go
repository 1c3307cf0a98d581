package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/sqlstore"
)

// must fails the test on err.
func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func smallSale() config {
	return config{Buyers: 400, Items: 2, Stock: 25, Duration: 20 * time.Second, Seed: 42,
		ExpireTTL: 100 * time.Millisecond, Reconcile: 100 * time.Millisecond}
}

// runSale runs the sale cfg and returns its report and what it printed; it fails the test when the
// run fails, or when the report's pass is not want.
func runSale(t *testing.T, cfg config, want bool) (Report, string) {
	t.Helper()
	var out bytes.Buffer
	rep, err := run(context.Background(), cfg, &out)
	if err != nil || rep.Passed != want {
		t.Fatalf("run: %v, passed %v, want %v\n%s", err, rep.Passed, want, out.String())
	}
	return rep, out.String()
}

// A small sale passes every check, says so, counts every buyer and every outcome, and its
// items add up in Redis, in the database and in the final reconcile pass.
func TestFlashSale(t *testing.T) {
	rep, out := runSale(t, smallSale(), true)
	if !strings.Contains(out, "PASS: every check holds") || strings.Contains(out, "FAIL") {
		t.Errorf("the printed report does not say PASS:\n%s", out)
	}
	if len(rep.Checks) < 6 {
		t.Errorf("%d checks, want at least 6", len(rep.Checks))
	}
	for _, c := range rep.Checks {
		if !c.OK {
			t.Errorf("FAIL %s: %s", c.Name, c.Detail)
		}
	}

	// Every buyer came (the sale ends only when they are done, well before the 20s cap), and
	// every call has exactly one counted outcome.
	if rep.Buyers != 400 || rep.Late != 0 {
		t.Errorf("%d buyers came, %d late; want 400, 0", rep.Buyers, rep.Late)
	}
	var calls, ok int64
	outcomes := map[string]int64{}
	for _, o := range rep.Outcomes {
		calls += o.Count
		outcomes[o.Outcome] += o.Count
		if o.Why == "" {
			t.Errorf("unexplained outcome %+v", o)
		}
		if (o.Op == "deduct" || o.Op == "confirm") && o.Outcome == "ok" {
			ok += o.Count
		}
	}
	if calls != rep.Ops {
		t.Errorf("outcomes add up to %d calls, the report says %d", calls, rep.Ops)
	}
	if outcomes["error"] != 0 || outcomes["sold_out"] == 0 || outcomes["replay"] == 0 {
		t.Errorf("outcomes %v: want no error, some sold_out and some replays", outcomes)
	}

	// Per item: bought = Redis sold = loaded - available (no hold left) = database sold.
	var bought int64
	for _, it := range rep.Items {
		lv := it.Redis
		if it.Loaded != 25 || lv.Loaded != 25 || lv.Held != 0 || lv.Available < 0 ||
			it.Bought != lv.Sold || lv.Sold+lv.Available != lv.Loaded ||
			it.DBRemaining != lv.Available || it.DBApplied != it.Bought {
			t.Errorf("item %+v does not add up", it)
		}
		bought += it.Bought
	}
	if len(rep.Items) != 2 || bought == 0 || bought > 50 {
		t.Errorf("%d items, %d units bought; want 2 items, 1..50 units", len(rep.Items), bought)
	}
	// Units kept are at most the successful deducts and confirms (restores gave some back).
	if bought > ok*2 {
		t.Errorf("%d units bought from %d successful deducts and confirms", bought, ok)
	}
	for _, rp := range rep.Reconcile {
		if rp.Drift != 0 || rp.Pending != 0 || rp.NeedsHuman != "" {
			t.Errorf("final reconcile: %s", rp)
		}
	}
}

// A unit slipped into Redis behind the library's back: the final reconcile pass finds the
// drift (and repairs it), and the report fails.
func TestFlashSaleCatchesDrift(t *testing.T) {
	cfg := smallSale()
	cfg.Buyers, cfg.Items = 100, 1
	cfg.tamper = func(ctx context.Context, c rueidis.Client) error {
		return c.Do(ctx, c.B().Hincrby().Key(cfg.Prefix+":{item-1}").Field("a").Increment(1).Build()).Error()
	}
	cfg.Prefix = "flashsale-test"
	if _, out := runSale(t, cfg, false); !strings.Contains(out, "FAIL  reconciler") {
		t.Fatalf("the reconciler did not fail the drifted item:\n%s", out)
	}
}

// tablePrefix turns a key prefix into a table name prefix the databases take.
func TestTablePrefix(t *testing.T) {
	for in, want := range map[string]string{
		"flashsale-1a2b":        "flashsale_1a2b_",
		"9lives":                "t9lives_",
		"a.b:c":                 "a_b_c_",
		strings.Repeat("x", 60): strings.Repeat("x", 47) + "_",
	} {
		if got := tablePrefix(in); got != want {
			t.Errorf("tablePrefix(%q) = %q, want %q", in, got, want)
		}
	}
}

// The -dsn URL form stockctl accepts works here too: mysql://user@host:port/db (it failed with
// "default addr for network '127.0.0.1:3306' unknown"), when STOCK_TEST_MYSQL names a server
// on 127.0.0.1:3306.
func TestOpenDBMySQLURL(t *testing.T) {
	if os.Getenv("STOCK_TEST_MYSQL") == "" {
		t.Skip("STOCK_TEST_MYSQL is not set: no MySQL server to open")
	}
	d, err := openDB(config{DSN: "mysql://root@127.0.0.1:3306/test"})
	must(t, err)
	defer d.close(false, io.Discard)
	if d.dialect != sqlstore.MySQL || strings.Contains(d.desc, "xxxxx") {
		t.Errorf("dialect %v, desc %q", d.dialect, d.desc)
	}
	if _, err := openDB(config{DSN: "oracle://x"}); err == nil {
		t.Error("oracle://x opened")
	}
}

// A run ended by SIGPIPE (its reader went away), SIGINT, SIGTERM or SIGHUP removes its keys,
// its tables and its SQLite file before it exits. The run is the built command, on the real
// Redis when STOCK_REDIS_SERVER is set (else the embedded miniredis), its SQLite file in a
// temporary directory of its own (TMPDIR), which must be empty afterwards.
func TestInterruptedRunCleansUp(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds and runs the command")
	}
	bin := filepath.Join(t.TempDir(), "flashsale")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var srv *redistest.Server
	if redistest.ServerBinary(t) != "" {
		srv = redistest.StartServer(t)
	}
	for _, sig := range []syscall.Signal{syscall.SIGPIPE, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel() // its own key prefix and temporary directory
			tmp := t.TempDir()
			prefix := "fs-sig-" + strconv.Itoa(int(sig))
			args := []string{"-buyers", "20000", "-duration", "60s", "-prefix", prefix}
			if srv != nil {
				args = append(args, "-redis", srv.Addr())
			}
			cmd := exec.Command(bin, args...)
			cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			stdout, err := cmd.StdoutPipe()
			must(t, err)
			must(t, cmd.Start())
			line, err := bufio.NewReader(stdout).ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "flash sale:") {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("first line %q, %v; stderr %s", line, err, stderr.String())
			}
			if sig == syscall.SIGPIPE {
				stdout.Close() // the next progress line hits a broken pipe
			} else if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err = <-done:
			case <-time.After(2 * time.Minute):
				cmd.Process.Kill()
				t.Fatalf("still running two minutes after %v", sig)
			}
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Errorf("exit: %v, want status 2 (interrupted); stderr %s", err, stderr.String())
			}
			left, _ := os.ReadDir(tmp)
			if len(left) != 0 {
				t.Errorf("after %v, the temporary directory holds %v", sig, left)
			}
			if srv != nil {
				c := srv.Client(t)
				keys, err := c.Do(context.Background(), c.B().Keys().Pattern(prefix+":*").Build()).AsStrSlice()
				if err != nil || len(keys) != 0 {
					t.Errorf("after %v, Redis keeps %v (%v)", sig, keys, err)
				}
			}
		})
	}
}

// A sale that runs to its end removes every key of its prefix, the prefix's own keys included
// (the registry, and the failover guard's epoch that the first Load records on a real Redis):
// on the embedded miniredis, and with STOCK_REDIS_SERVER set on a private redis-server too.
func TestFinishedRunLeavesNoKeys(t *testing.T) {
	finish := func(t *testing.T, addr string) {
		cfg := smallSale()
		cfg.Buyers, cfg.Redis, cfg.Prefix = 200, addr, "fs-finished"
		left := []string{"(the clean-up hook did not run)"}
		cfg.cleaned = func(ctx context.Context, c rueidis.Client) {
			var err error
			if left, err = c.Do(ctx, c.B().Keys().Pattern(cfg.Prefix+":*").Build()).AsStrSlice(); err != nil {
				left = []string{err.Error()}
			}
		}
		runSale(t, cfg, true)
		if len(left) != 0 {
			t.Errorf("after the sale, Redis keeps %v", left)
		}
	}
	t.Run("miniredis", func(t *testing.T) { finish(t, "") })
	t.Run("redis-server", func(t *testing.T) {
		if redistest.ServerBinary(t) == "" {
			t.Skipf("%s is not set: no real Redis", redistest.EnvServer)
		}
		finish(t, redistest.StartServer(t).Addr())
	})
}

// -redis takes a URL with an ACL user's name and password (redis://user:password@host:port),
// as stockctl does; a wrong password is an error that does not show it.
func TestFlashSaleRedisURL(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skip("STOCK_REDIS_SERVER is not set: no real Redis to log in to")
	}
	srv := redistest.StartServer(t)
	admin := srv.Client(t)
	ctx := context.Background()
	must(t, admin.Do(ctx, admin.B().Arbitrary("ACL", "SETUSER").Args("sale", "on", ">p@ss", "~*", "&*", "+@all").Build()).Error())
	cfg := smallSale()
	cfg.Buyers, cfg.Items = 100, 1
	cfg.Redis = "redis://sale:p%40ss@" + srv.Addr()
	if _, out := runSale(t, cfg, true); strings.Contains(out, "p@ss") || strings.Contains(out, "p%40ss") {
		t.Errorf("the report shows the password:\n%s", out)
	}
	cfg.Redis = "redis://sale:wrong-secret@" + srv.Addr()
	_, err := run(ctx, cfg, io.Discard)
	if err == nil || strings.Contains(err.Error(), "wrong-secret") {
		t.Errorf("wrong password: %v", err)
	}
}

// -failover-at takes a share of the buyers; the Sentinel flags refuse what cannot go together,
// and a Sentinel sale holds for a minute.
func TestSentinelFlags(t *testing.T) {
	for in, want := range map[string]float64{"50%": 0.5, "0.25": 0.25, "100%": 1, "0": 0} {
		got, err := parseShare(in)
		if err != nil || got != want {
			t.Errorf("parseShare(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "x", "150%", "-1", "2"} {
		if _, err := parseShare(bad); err == nil {
			t.Errorf("parseShare(%q): no error", bad)
		}
	}
	for _, c := range []config{
		{FailoverAt: 0.5},                    // no -sentinel
		{Sentinel: "s@h:1", Redis: "h:2"},    // two Redis
		{Sentinel: "s@h:1", ReplicaAck: -1},  // negative
		{Sentinel: "s@h:1", FailoverAt: 1.5}, // beyond the buyers
		{Sentinel: "s@h:1", Cluster: []string{"h:3"}},
	} {
		if _, err := c.withDefaults(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
	c, err := config{Sentinel: "s@h:1", FailoverAt: 0.5, ReplicaAck: 1}.withDefaults()
	if err != nil || c.HoldTTL != time.Minute {
		t.Errorf("%+v %v: want a minute of hold on Sentinel", c, err)
	}
}

// A sale whose items are each split over 3 buckets passes every check (Levels, the ledger and
// the database cover every bucket): on the embedded miniredis, and with STOCK_REDIS_SERVER set
// on a private 3-master cluster too, where the buckets of an item live on different masters and
// every key of every bucket is deleted at the end.
func TestFlashSaleBuckets(t *testing.T) {
	split := func(t *testing.T, cfg config) {
		t.Helper()
		cfg.Buckets = 3
		rep, out := runSale(t, cfg, true)
		if !strings.Contains(out, "each split over 3 buckets") {
			t.Fatalf("the report does not say the items are split:\n%s", out)
		}
		var sold, loaded int64
		for _, it := range rep.Items {
			sold, loaded = sold+it.Redis.Sold, loaded+it.Redis.Loaded
		}
		if loaded != int64(cfg.Items)*cfg.Stock || sold == 0 {
			t.Errorf("Levels of the split items: %d sold of %d loaded\n%s", sold, loaded, out)
		}
	}
	t.Run("embedded", func(t *testing.T) { split(t, smallSale()) })
	t.Run("cluster", func(t *testing.T) {
		if redistest.ServerBinary(t) == "" {
			t.Skipf("%s is not set: no real Redis Cluster", redistest.EnvServer)
		}
		cluster := redistest.StartCluster(t, 3)
		cfg := smallSale()
		cfg.Cluster, cfg.Prefix = cluster.Addrs(), "fs-buckets"
		split(t, cfg)
		c := cluster.Client(t)
		for addr, node := range c.Nodes() {
			keys, err := node.Do(context.Background(), node.B().Keys().Pattern(cfg.Prefix+":*").Build()).AsStrSlice()
			if err != nil || len(keys) != 0 {
				t.Errorf("%s keeps %v (%v)", addr, keys, err)
			}
		}
	})
}
