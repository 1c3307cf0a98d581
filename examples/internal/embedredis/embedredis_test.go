package embedredis

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"

	"github.com/stockres/stock"
)

// must fails the test on err.
func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// loadAndLog loads an item through a Reserver on the miniredis at addr and returns what the
// library logged at Warn level and above.
func loadAndLog(t *testing.T, addr string) string {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	must(t, err)
	defer c.Close()
	var logs bytes.Buffer
	r, err := stock.New(c, stock.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	must(t, err)
	must(t, r.Load(context.Background(), "item", 5))
	must(t, r.Close(context.Background()))
	return logs.String()
}

// The library's memory-policy check reads noeviction from the embedded miniredis and writes
// without a warning; on a plain miniredis, which has no CONFIG, it warns that it could not
// check (so the first half would catch the warning coming back).
func TestEmbeddedRedisPassesThePolicyCheckQuietly(t *testing.T) {
	m, err := Start()
	must(t, err)
	defer m.Close()
	if logs := loadAndLog(t, m.Addr()); logs != "" {
		t.Errorf("the library logged on the embedded miniredis:\n%s", logs)
	}

	plain := miniredis.RunT(t)
	if logs := loadAndLog(t, plain.Addr()); !strings.Contains(logs, "maxmemory-policy") {
		t.Errorf("on a plain miniredis, no warning about the unchecked policy: %q", logs)
	}
}

// Other CONFIG calls get an error reply, as from a Redis whose CONFIG is renamed away.
func TestEmbeddedRedisRefusesOtherConfig(t *testing.T) {
	m, err := Start()
	must(t, err)
	defer m.Close()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{m.Addr()}, DisableCache: true})
	must(t, err)
	defer c.Close()
	ctx := context.Background()
	got, err := c.Do(ctx, c.B().ConfigGet().Parameter("maxmemory-policy").Build()).AsStrMap()
	if err != nil || got["maxmemory-policy"] != "noeviction" {
		t.Errorf("CONFIG GET maxmemory-policy: %v, %v", got, err)
	}
	if err := c.Do(ctx, c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory-policy", "allkeys-lru").Build()).Error(); err == nil {
		t.Error("CONFIG SET answered OK")
	}
}
