// Package embedredis starts the in-process Redis (miniredis) the examples run on when they are
// given no real Redis.
package embedredis

import (
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
)

// Start starts a miniredis that answers CONFIG GET maxmemory-policy with noeviction, which is
// what miniredis does: it has no maxmemory and never evicts a key. The stock library reads that
// setting on its first write and refuses to write on a policy that can evict its keys; miniredis
// itself has no CONFIG command, and the library then writes all the same and logs one warning
// that it could not check (see docs/operating.md, "Memory policy: noeviction"), which would be
// the first line every example prints. A real Redis answers for itself: set its policy to
// noeviction. Every other CONFIG call gets an error reply, as from a Redis whose CONFIG is
// renamed away.
//
// The caller closes the server. A client on it needs DisableCache: miniredis has no client
// tracking.
func Start() (*miniredis.Miniredis, error) {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		return nil, err
	}
	err := m.Server().Register("CONFIG", func(c *server.Peer, _ string, args []string) {
		if len(args) == 2 && strings.EqualFold(args[0], "GET") && strings.EqualFold(args[1], "maxmemory-policy") {
			c.WriteMapLen(1)
			c.WriteBulk("maxmemory-policy")
			c.WriteBulk("noeviction")
			return
		}
		c.WriteError("ERR the embedded miniredis answers only CONFIG GET maxmemory-policy")
	})
	if err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}
