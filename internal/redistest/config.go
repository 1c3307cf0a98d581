package redistest

import (
	"strings"
	"sync"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
)

// MiniredisConfig gives m the CONFIG GET and CONFIG SET commands that miniredis lacks, for one
// parameter at a time, over params (the parameters m is to know, with their first values;
// others answer an empty map, as Redis does for an unknown parameter). Tests of code that reads
// the server's config (maxmemory-policy) run on miniredis too that way. Without it, miniredis
// answers CONFIG with an error reply, as a Redis whose CONFIG is renamed away does.
func MiniredisConfig(m *miniredis.Miniredis, params map[string]string) error {
	var mu sync.Mutex
	conf := map[string]string{}
	for k, v := range params {
		conf[k] = v
	}
	return m.Server().Register("CONFIG", func(c *server.Peer, _ string, args []string) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case len(args) == 2 && strings.EqualFold(args[0], "GET"):
			v, ok := conf[strings.ToLower(args[1])]
			if !ok {
				c.WriteMapLen(0)
				return
			}
			c.WriteMapLen(1)
			c.WriteBulk(strings.ToLower(args[1]))
			c.WriteBulk(v)
		case len(args) == 3 && strings.EqualFold(args[0], "SET"):
			if _, ok := conf[strings.ToLower(args[1])]; !ok {
				c.WriteError("ERR Unknown option or number of arguments for CONFIG SET - '" + args[1] + "'")
				return
			}
			conf[strings.ToLower(args[1])] = args[2]
			c.WriteOK()
		default:
			c.WriteError("ERR redistest: CONFIG supports GET and SET of one parameter")
		}
	})
}
