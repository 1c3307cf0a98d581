package protocol

import (
	"errors"
	"strings"
	"testing"

	"github.com/redis/rueidis/mock"
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
		if got := refusedFcall(mock.Result(mock.RedisError(msg)).Error()); got != want {
			t.Errorf("%q: %d, want %d", msg, got, want)
		}
	}
	if got := refusedFcall(errors.New("connection reset")); got != fcallRan {
		t.Errorf("a connection error: %d, want fcallRan (the outcome is unknown)", got)
	}
	if got := refusedFcall(nil); got != fcallRan {
		t.Errorf("no error: %d", got)
	}
}

// TestLibraryRegistersEveryScript: the library registers each script's body once, under the
// script's Func, a name of the library.
func TestLibraryRegistersEveryScript(t *testing.T) {
	if !strings.HasPrefix(Library, "#!lua name="+LibraryName+"\n") {
		t.Fatalf("library header: %q", Library[:min(60, len(Library))])
	}
	for _, s := range scripts {
		if !strings.HasPrefix(s.Func, LibraryName+"_") {
			t.Errorf("%s: function %q not in library %s", s.Name, s.Func, LibraryName)
		}
		reg := "redis.register_function('" + s.Func + "', function(KEYS, ARGV)\n" + s.body + "\nend)\n"
		if strings.Count(Library, reg) != 1 {
			t.Errorf("%s: not registered once with its body", s.Name)
		}
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
		if !contains(names, want) {
			t.Errorf("lib.lua: %s not found among %v", want, names)
		}
	}
	for _, s := range scripts {
		body := lua.Source(s.Name)
		if !strings.HasSuffix(s.Source, body) {
			t.Fatalf("%s: the source does not end with the body", s.Name)
		}
		if len(s.Source) >= len(lib)+len(body) {
			t.Errorf("%s: %d bytes, no shorter than lib.lua and the body", s.Name, len(s.Source))
		}
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
			if contains(names, id) && !defined[id] {
				t.Errorf("%s: uses %s without its definition", s.Name, id)
			}
		}
	}
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

func TestSplitLibRefusesOtherStatements(t *testing.T) {
	for _, lib := range []string{
		"x = 1\n",
		"  local y = 2\n",
		"redis.call('DEL', 'k')\n",
	} {
		if _, err := splitLib(lib); err == nil {
			t.Errorf("%q: no error", lib)
		}
	}
	got, err := withLib("local a = 1\n-- b\nlocal function b()\n  return a\nend\nlocal function c()\nend\n", "return b()")
	require.NoError(t, err)
	if want := "local a = 1\nlocal function b()\n  return a\nend\nreturn b()"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
