package protocol

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stockres/stock/lua"
)

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
