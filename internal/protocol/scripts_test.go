package protocol

import (
	"errors"
	"strings"
	"testing"

	"github.com/redis/rueidis/mock"
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
