package protocol

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/redis/rueidis/mock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stockres/stock/lua"
)

// TestRefusedFcall: only errors Redis gives before a function runs send a call to the script; an
// error of the function itself (which may come after a write) is its answer, even when it names
// an unknown command or a missing permission of a command the function ran.
func TestRefusedFcall(t *testing.T) {
	cases := map[string]int{
		"ERR Function not found": fcallNotFound,
		"ERR unknown command 'FCALL', with args beginning with: 'stock_x_deduct' ":               fcallUnsupported,
		"ERR unknown command `FCALL`, with args beginning with: `stock_x_load`, `2`, ":           fcallUnsupported,
		"NOPERM User shop-svc has no permissions to run the 'fcall' command":                     fcallUnsupported,
		"OOM command not allowed when used memory > 'maxmemory'.":                                fcallRefused,
		"ERR unknown command 'setbit', with args beginning with: script: ..., on @user_function": fcallRan,
		"NOPERM User shop-svc has no permissions to run the 'setbit' command script: ...":        fcallRan,
		"NOPERM No permissions to access a key":                                                  fcallRan,
		"ERR stock: corrupt ledger entry of id o1: x script: ..., on @user_function":             fcallRan,
		"BUSY Redis is busy running a script.":                                                   fcallRan,
	}
	for msg, want := range cases {
		assert.Equal(t, want, refusedFcall(mock.Result(mock.RedisError(msg)).Error()), msg)
	}
	assert.Equal(t, fcallRan, refusedFcall(errors.New("connection reset")), "a connection error: the outcome is unknown")
	assert.Equal(t, fcallRan, refusedFcall(nil), "no error")
}

// TestLibraryRegistersEveryScript: the library registers each script's body once, under the
// script's Func, a name of the library.
func TestLibraryRegistersEveryScript(t *testing.T) {
	require.True(t, strings.HasPrefix(Library, "#!lua name="+LibraryName+"\n"), "library header: %q", Library[:min(60, len(Library))])
	for _, s := range scripts {
		assert.True(t, strings.HasPrefix(s.Func, LibraryName+"_"), "%s: function %q not in library %s", s.Name, s.Func, LibraryName)
		reg := "redis.register_function('" + s.Func + "', function(KEYS, ARGV)\n" + s.body + "\nend)\n"
		assert.Equal(t, 1, strings.Count(Library, reg), "%s: registered once with its body", s.Name)
	}
}

// TestScriptsCarryOnlyTheirHelpers checks the cut of lib.lua: every definition is found, each
// script carries every helper its body names (directly or through another helper) and no other,
// and the result is what the scripts run.
func TestScriptsCarryOnlyTheirHelpers(t *testing.T) {
	lib := lua.Source("lib.lua")
	chunks, err := splitLib(lib)
	require.NoError(t, err)
	var names []string
	for _, c := range chunks {
		names = append(names, c.names...)
	}
	for _, want := range []string{"OK", "INVALID", "now_ms", "parse", "int", "plan_expiry", "release", "MAX_EXPIRY", "remember", "filter_step"} {
		assert.Contains(t, names, want, "lib.lua")
	}
	for _, s := range scripts {
		body := lua.Source(s.Name)
		require.True(t, strings.HasSuffix(s.Source, body), "%s: the source does not end with the body", s.Name)
		assert.Less(t, len(s.Source), len(lib)+len(body), "%s: no shorter than lib.lua and the body", s.Name)
		head := s.Source[:len(s.Source)-len(body)]
		defined := map[string]bool{}
		for _, c := range chunks {
			if strings.Contains(head, c.text) {
				for _, n := range c.names {
					defined[n] = true
				}
			}
		}
		for _, id := range luaIdent.FindAllString(luaNoise.ReplaceAllString(s.Source, " "), -1) {
			if slices.Contains(names, id) {
				assert.True(t, defined[id], "%s: uses %s without its definition", s.Name, id)
			}
		}
	}
}

func TestSplitLibRefusesOtherStatements(t *testing.T) {
	for _, lib := range []string{
		"x = 1\n",
		"  local y = 2\n",
		"redis.call('DEL', 'k')\n",
	} {
		_, err := splitLib(lib)
		assert.Error(t, err, lib)
	}
	got, err := withLib("local a = 1\n-- b\nlocal function b()\n  return a\nend\nlocal function c()\nend\n", "return b()")
	require.NoError(t, err)
	assert.Equal(t, "local a = 1\nlocal function b()\n  return a\nend\nreturn b()", got)
}
