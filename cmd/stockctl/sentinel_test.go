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
