package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock/internal/redistest"
)

func TestSentinelFlagUsage(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"-sentinel", "127.0.0.1:26379", "available", "A"}, &out, &errOut)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut.String(), "-sentinel")
	assert.Contains(t, errOut.String(), "name@host:port")
}

// TestSentinel runs stockctl on a Sentinel deployment through -sentinel, before and after a
// SENTINEL FAILOVER.
func TestSentinel(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skipf("%s is not set: a Sentinel deployment needs the redis-server binary", redistest.EnvServer)
	}
	d := redistest.StartSentinel(t, redistest.SentinelConfig{Replicas: 1})
	flagv := redistest.MasterSet + "@" + strings.Join(d.Addrs(), ",")
	prefix := fmt.Sprintf("t%d", time.Now().UnixNano())
	sctl := func(args ...string) result {
		t.Helper()
		var out, errOut bytes.Buffer
		code := run(context.Background(), append([]string{"-sentinel", flagv, "-prefix", prefix, "-timeout", "20s"}, args...), &out, &errOut)
		t.Logf("stockctl %s -> %d\n%s%s", strings.Join(args, " "), code, out.String(), errOut.String())
		return result{code, out.String(), errOut.String()}
	}
	require.Equal(t, exitOK, sctl("load", "A", "10").code)
	old, err := d.Primary()
	require.NoError(t, err)
	c := d.Client(t)
	require.NoError(t, c.Do(context.Background(), c.B().Wait().Numreplicas(1).Timeout(5000).Build()).Error())

	require.NoError(t, d.Failover())
	p, err := d.WaitPrimary(old, 30*time.Second)
	require.NoError(t, err)
	res := sctl("available", "A")
	assert.Equal(t, exitOK, res.code)
	assert.Equal(t, "10\n", res.stdout, "read on the new primary %s", p.Addr())
	res = sctl("restock", "A", "r1", "5")
	assert.Equal(t, exitOK, res.code, "a write on the new primary")
	assert.Equal(t, "15\n", sctl("available", "A").stdout)
}

// needSentinel skips unless a Sentinel deployment can be started (STOCK_REDIS_SERVER and
// STOCK_TEST_SENTINEL=1).
func needSentinel(t *testing.T) {
	t.Helper()
	if redistest.ServerBinary(t) == "" {
		t.Skip("needs STOCK_REDIS_SERVER (a redis-server binary) for a Sentinel deployment")
	}
	if !redistest.SentinelEnabled(t) {
		t.Skip("needs STOCK_TEST_SENTINEL=1")
	}
}

// runSentinelCLI runs stockctl with args, with no STOCKCTL_SENTINEL or STOCKCTL_REDIS.
func runSentinelCLI(t *testing.T, args ...string) (code int, stdout, stderr string, took time.Duration) {
	t.Helper()
	t.Setenv("STOCKCTL_SENTINEL", "")
	t.Setenv("STOCKCTL_REDIS", "")
	var out, errb bytes.Buffer
	start := time.Now()
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String(), time.Since(start)
}

// TestSentinelFlagBadInput: a -sentinel value that cannot name a Sentinel deployment
// must be a usage error (exit 2) that names the flag, found before anything is dialled, not a
// connection failure (exit 1) an operator would take for a network problem.
func TestSentinelFlagBadInput(t *testing.T) {
	needSentinel(t)
	cases := []struct{ name, value string }{
		{"empty name", "@127.0.0.1:1"},
		{"no address", "stock@"},
		{"no port", "stock@127.0.0.1"},
		{"no at sign", "stock"},
		{"space in name", "sto ck@127.0.0.1:1"},
		{"duplicate address", "stock@127.0.0.1:1,127.0.0.1:1"},
		{"duplicate address, three", "stock@127.0.0.1:1,127.0.0.1:2,127.0.0.1:1"},
		{"empty element", "stock@127.0.0.1:1,,127.0.0.1:2"},
		{"trailing comma", "stock@127.0.0.1:1,"},
		{"leading comma", "stock@,127.0.0.1:1"},
		{"port not a number", "stock@127.0.0.1:abc"},
		{"port out of range", "stock@127.0.0.1:99999"},
		{"port zero", "stock@127.0.0.1:0"},
		{"negative port", "stock@127.0.0.1:-1"},
		{"empty host", "stock@:1"},
		{"second at sign", "st@ck@127.0.0.1:1"},
		{"space inside an address", "stock@127.0.0.1 127.0.0.2:1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, _, stderr, took := runSentinelCLI(t, "-timeout", "3s", "-sentinel", c.value, "items")
			if code != exitUsage {
				t.Errorf("-sentinel %q: exit %d, want %d (usage error); stderr: %s", c.value, code, exitUsage, strings.TrimSpace(stderr))
			}
			if code == exitUsage && !strings.Contains(stderr, "-sentinel") {
				t.Errorf("-sentinel %q: the error does not name the flag: %s", c.value, strings.TrimSpace(stderr))
			}
			if took > 2*time.Second {
				t.Errorf("-sentinel %q: took %v: the bad value was dialled", c.value, took)
			}
		})
	}
}

// TestSentinelFlagEnvBadInput: the same value through STOCKCTL_SENTINEL.
func TestSentinelFlagEnvBadInput(t *testing.T) {
	needSentinel(t)
	for _, v := range []string{"@127.0.0.1:1", "stock@127.0.0.1", "stock@127.0.0.1:1,127.0.0.1:1"} {
		t.Setenv("STOCKCTL_REDIS", "")
		t.Setenv("STOCKCTL_SENTINEL", v)
		var out, errb bytes.Buffer
		code := run(context.Background(), []string{"-timeout", "3s", "items"}, &out, &errb)
		if code != exitUsage {
			t.Errorf("STOCKCTL_SENTINEL=%q: exit %d, want %d; stderr: %s", v, code, exitUsage, strings.TrimSpace(errb.String()))
		}
	}
}

// TestSentinelFlagWorks: the positive control, on a real Sentinel deployment, including
// a failover between two commands: stockctl follows the primary the sentinels announce.
func TestSentinelFlagWorks(t *testing.T) {
	needSentinel(t)
	d := redistest.StartSentinel(t, redistest.SentinelConfig{Replicas: 1})
	flag := redistest.MasterSet + "@" + strings.Join(d.Addrs(), ",")
	if code, _, stderr, _ := runSentinelCLI(t, "-timeout", "10s", "-sentinel", flag, "load", "sentinel-cli", "7"); code != exitOK {
		t.Fatalf("load: exit %d: %s", code, stderr)
	}
	old, err := d.Primary()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Failover(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.WaitPrimary(old, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	// With spaces around the parts, as pasted from a config file.
	spaced := " " + redistest.MasterSet + " @ " + strings.Join(d.Addrs(), " , ") + " "
	for _, f := range []string{flag, spaced} {
		code, stdout, stderr, _ := runSentinelCLI(t, "-timeout", "10s", "-sentinel", f, "available", "sentinel-cli")
		if code == exitUsage && f == spaced {
			continue // rejecting spaces is a fair answer too
		}
		if code != exitOK || strings.TrimSpace(stdout) != "7" {
			t.Errorf("-sentinel %q available after a failover: exit %d, stdout %q, stderr %q", f, code, stdout, stderr)
		}
	}
}
