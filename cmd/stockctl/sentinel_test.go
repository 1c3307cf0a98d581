package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock/internal/redistest"
)

// TestSentinel runs stockctl on a Sentinel deployment through -sentinel, before and after a
// SENTINEL FAILOVER: it follows the primary the sentinels announce, for reads and writes, also
// with spaces around the parts of -sentinel, as pasted from a config file.
func TestSentinel(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skipf("%s is not set: a Sentinel deployment needs the redis-server binary", redistest.EnvServer)
	}
	clearEnv(t)
	d := redistest.StartSentinel(t, redistest.SentinelConfig{Replicas: 1})
	flagv := redistest.MasterSet + "@" + strings.Join(d.Addrs(), ",")
	prefix := fmt.Sprintf("t%d", time.Now().UnixNano())
	sctl := func(f string, args ...string) cliResult {
		t.Helper()
		res := runCLI(t, append([]string{"-sentinel", f, "-prefix", prefix, "-timeout", "20s"}, args...)...)
		t.Logf("stockctl %s -> %d\n%s%s", strings.Join(args, " "), res.code, res.out, res.err)
		return res
	}
	require.Equal(t, exitOK, sctl(flagv, "load", "A", "10").code)
	old, err := d.Primary()
	require.NoError(t, err)
	c := d.Client(t)
	require.NoError(t, c.Do(t.Context(), c.B().Wait().Numreplicas(1).Timeout(5000).Build()).Error())

	require.NoError(t, d.Failover())
	p, err := d.WaitPrimary(old, 30*time.Second)
	require.NoError(t, err)
	res := sctl(flagv, "available", "A")
	assert.Equal(t, exitOK, res.code)
	assert.Equal(t, "10\n", res.out, "read on the new primary %s", p.Addr())
	spaced := " " + redistest.MasterSet + " @ " + strings.Join(d.Addrs(), " , ") + " "
	if res := sctl(spaced, "available", "A"); res.code != exitUsage { // rejecting spaces is a fair answer too
		assert.Equal(t, exitOK, res.code)
		assert.Equal(t, "10\n", res.out, "-sentinel with spaces")
	}
	res = sctl(flagv, "restock", "A", "r1", "5")
	assert.Equal(t, exitOK, res.code, "a write on the new primary")
	assert.Equal(t, "15\n", sctl(flagv, "available", "A").out)
}

// A -sentinel value (or STOCKCTL_SENTINEL) that cannot name a Sentinel deployment must be a
// usage error (exit 2) that names the flag, found before anything is dialled, not a connection
// failure (exit 1) an operator would take for a network problem.
func TestSentinelFlagBadInput(t *testing.T) {
	if redistest.ServerBinary(t) == "" {
		t.Skip("needs STOCK_REDIS_SERVER (a redis-server binary) for a Sentinel deployment")
	}
	if !redistest.SentinelEnabled(t) {
		t.Skip("needs STOCK_TEST_SENTINEL=1")
	}
	for _, c := range []struct{ name, value string }{
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
	} {
		t.Run(c.name, func(t *testing.T) {
			clearEnv(t)
			res := runCLI(t, "-timeout", "3s", "-sentinel", c.value, "items")
			if res.code != exitUsage || !strings.Contains(res.err, "-sentinel") {
				t.Errorf("-sentinel %q: want exit %d (usage error) naming the flag\n%v", c.value, exitUsage, res)
			}
			if res.took > 2*time.Second {
				t.Errorf("-sentinel %q: took %v: the bad value was dialled", c.value, res.took)
			}
		})
	}
	for _, v := range []string{"@127.0.0.1:1", "stock@127.0.0.1", "stock@127.0.0.1:1,127.0.0.1:1"} {
		t.Run("STOCKCTL_SENTINEL="+v, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("STOCKCTL_SENTINEL", v)
			if res := runCLI(t, "-timeout", "3s", "items"); res.code != exitUsage {
				t.Errorf("want exit %d\n%v", exitUsage, res)
			}
		})
	}
}
