package protocol

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stockres/stock/lua"
)

// luaConst matches a Lua statement declaring upper-case locals with integer values:
// "local OK, REPLAY = 0, 1" (across lines too).
var luaConst = regexp.MustCompile(`(?m)^local\s+([A-Z][A-Z0-9_]*(?:\s*,\s*[A-Z][A-Z0-9_]*)*)\s*=\s*(-?\d+(?:\s*,\s*-?\d+)*)`)

// notCodes are upper-case integer constants of the scripts that are not reply codes.
var notCodes = []string{"MAX_EXPIRY"}

// codeMismatches compares the reply codes declared by the scripts (name -> text) with want: a
// code missing on either side, declared twice, or with another value.
func codeMismatches(scripts map[string]string, want map[string]int64) []string {
	var bad []string
	declared := map[string]string{} // name -> file
	for _, file := range slices.Sorted(maps.Keys(scripts)) {
		for _, m := range luaConst.FindAllStringSubmatch(scripts[file], -1) {
			names, values := split(m[1]), split(m[2])
			if len(names) != len(values) {
				bad = append(bad, fmt.Sprintf("%s: %d names, %d values in %q", file, len(names), len(values), m[0]))
				continue
			}
			for i, name := range names {
				if slices.Contains(notCodes, name) {
					continue
				}
				v, _ := strconv.ParseInt(values[i], 10, 64)
				if prev, dup := declared[name]; dup {
					bad = append(bad, fmt.Sprintf("%s: %s declared again (first in %s)", file, name, prev))
				}
				declared[name] = file
				w, ok := want[name]
				switch {
				case !ok:
					bad = append(bad, fmt.Sprintf("%s: %s = %d has no Go constant", file, name, v))
				case w != v:
					bad = append(bad, fmt.Sprintf("%s: %s = %d, Go says %d", file, name, v, w))
				case file != "lib.lua":
					bad = append(bad, fmt.Sprintf("%s: %s is declared outside lib.lua", file, name))
				}
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if _, ok := declared[name]; !ok {
			bad = append(bad, fmt.Sprintf("%s = %d is not declared in lua/lib.lua", name, want[name]))
		}
	}
	return bad
}

func split(s string) []string {
	f := strings.Split(s, ",")
	for i := range f {
		f[i] = strings.TrimSpace(f[i])
	}
	return f
}

func luaSources() map[string]string {
	out := map[string]string{}
	for _, name := range lua.Names() {
		out[name] = lua.Source(name)
	}
	return out
}

// TestReplyCodesMatchLua: every reply code of this package is declared in lua/lib.lua with the
// same value, and no script declares a code this package does not know.
func TestReplyCodesMatchLua(t *testing.T) {
	for _, m := range codeMismatches(luaSources(), LuaCodes) {
		t.Error(m)
	}
}

// TestReplyCodesCheckBites: the check above fails on a script whose codes drifted.
func TestReplyCodesCheckBites(t *testing.T) {
	for name, mutate := range map[string]func(map[string]string){
		"value changed in lib.lua": func(s map[string]string) {
			s["lib.lua"] = strings.Replace(s["lib.lua"], "10,      11,        12", "10,      11,        13", 1)
		},
		"code added in lib.lua only": func(s map[string]string) { s["lib.lua"] += "\nlocal BUSY = 13\n" },
		"code declared in a script":  func(s map[string]string) { s["deduct.lua"] = "local SOLDOUT = 2\n" + s["deduct.lua"] },
		"code removed from lib.lua": func(s map[string]string) {
			s["lib.lua"] = strings.Replace(s["lib.lua"], "local UNTAKEN = -1", "", 1)
		},
	} {
		s := luaSources()
		mutate(s)
		if got := codeMismatches(s, LuaCodes); len(got) == 0 {
			t.Errorf("%s: no mismatch found", name)
		}
	}
	if got := codeMismatches(luaSources(), map[string]int64{"OK": 0}); len(got) == 0 {
		t.Error("a Go side with codes missing: no mismatch found")
	}
}
