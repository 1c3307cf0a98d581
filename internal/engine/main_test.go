package engine

import (
	"os"
	"testing"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock/internal/redistest"
)

// TestMain starts the real Redis deployments the tests run on when STOCK_REDIS_SERVER names a
// redis-server binary (redistest.Backends), and stops them at the end.
func TestMain(m *testing.M) { os.Exit(redistest.Run(m)) }

// eachBackend runs f on every backend (redistest.Backends), the backends in parallel.
func eachBackend(t *testing.T, f func(t *testing.T, b redistest.Backend)) {
	t.Helper()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			f(t, b)
		})
	}
}

// eachClient is eachBackend with a client of the backend.
func eachClient(t *testing.T, f func(t *testing.T, c rueidis.Client)) {
	t.Helper()
	eachBackend(t, func(t *testing.T, b redistest.Backend) { f(t, b.Client(t)) })
}

// eachReserver is eachClient with a Reserver on the client.
func eachReserver(t *testing.T, f func(t *testing.T, r *Reserver)) {
	t.Helper()
	eachClient(t, func(t *testing.T, c rueidis.Client) {
		r, err := New(c)
		require.NoError(t, err)
		f(t, r)
	})
}
