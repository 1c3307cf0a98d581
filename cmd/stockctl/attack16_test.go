package main

// Attack 16: the -sentinel flag of stockctl, attacked as an operator would type it.

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stockres/stock/internal/redistest"
)

func a16Skip(t *testing.T) {
	t.Helper()
	if redistest.ServerBinary(t) == "" {
		t.Skip("attack16: needs STOCK_REDIS_SERVER (a redis-server binary) for a Sentinel deployment")
	}
	if !redistest.SentinelEnabled(t) {
		t.Skip("attack16: needs STOCK_TEST_SENTINEL=1")
	}
}

func a16Run(t *testing.T, args ...string) (code int, stdout, stderr string, took time.Duration) {
	t.Helper()
	t.Setenv("STOCKCTL_SENTINEL", "")
	t.Setenv("STOCKCTL_REDIS", "")
	var out, errb bytes.Buffer
	start := time.Now()
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String(), time.Since(start)
}

// TestAttack16SentinelFlagBadInput: a -sentinel value that cannot name a Sentinel deployment
// must be a usage error (exit 2) that names the flag, found before anything is dialled, not a
// connection failure (exit 1) an operator would take for a network problem.
func TestAttack16SentinelFlagBadInput(t *testing.T) {
	a16Skip(t)
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
			code, _, stderr, took := a16Run(t, "-timeout", "3s", "-sentinel", c.value, "items")
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

// TestAttack16SentinelFlagEnvBadInput: the same value through STOCKCTL_SENTINEL.
func TestAttack16SentinelFlagEnvBadInput(t *testing.T) {
	a16Skip(t)
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

// TestAttack16SentinelFlagWorks: the positive control, on a real Sentinel deployment, including
// a failover between two commands: stockctl follows the primary the sentinels announce.
func TestAttack16SentinelFlagWorks(t *testing.T) {
	a16Skip(t)
	d := redistest.StartSentinel(t, redistest.SentinelConfig{Replicas: 1})
	flag := redistest.MasterSet + "@" + strings.Join(d.Addrs(), ",")
	if code, _, stderr, _ := a16Run(t, "-timeout", "10s", "-sentinel", flag, "load", "a16-cli", "7"); code != exitOK {
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
		code, stdout, stderr, _ := a16Run(t, "-timeout", "10s", "-sentinel", f, "available", "a16-cli")
		if code == exitUsage && f == spaced {
			continue // rejecting spaces is a fair answer too
		}
		if code != exitOK || strings.TrimSpace(stdout) != "7" {
			t.Errorf("-sentinel %q available after a failover: exit %d, stdout %q, stderr %q", f, code, stdout, stderr)
		}
	}
}
