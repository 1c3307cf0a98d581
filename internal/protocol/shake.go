package protocol

import (
	"fmt"
	"regexp"
	"strings"
)

// Each script carries only the helpers of lua/lib.lua it uses: the library is cut into its
// top-level definitions once, at init, and a script is the definitions its body needs followed by
// the body.

// libChunk is one top-level definition of lua/lib.lua: its text and the names it defines.
type libChunk struct {
	names []string
	text  string
}

var (
	luaIdent    = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*`)
	luaNoise    = regexp.MustCompile(`'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"|--[^\n]*`)
	luaLocalFn  = regexp.MustCompile(`^local function ([A-Za-z_][A-Za-z0-9_]*)\(`)
	luaLocalVar = regexp.MustCompile(`^local ([A-Za-z_][A-Za-z0-9_]*(?:, *[A-Za-z_][A-Za-z0-9_]*)*) *=`)
)

// splitLib cuts the library into its top-level definitions, in order. A definition starts at an
// unindented line "local function f(" or "local a, b =" and runs to the next unindented line
// that is not "end"; unindented comments and blank lines between definitions are dropped. Any
// other unindented line is an error: the library holds definitions only.
func splitLib(lib string) ([]libChunk, error) {
	var chunks []libChunk
	var cur *libChunk
	var b strings.Builder
	flush := func() {
		if cur != nil {
			cur.text = b.String()
			chunks = append(chunks, *cur)
			cur = nil
			b.Reset()
		}
	}
	for i, line := range strings.Split(lib, "\n") {
		indented := line != "" && (line[0] == ' ' || line[0] == '\t')
		switch {
		case indented || (cur != nil && strings.TrimRight(line, " \t") == "end"):
			if cur == nil {
				return nil, fmt.Errorf("lib.lua:%d: indented line outside a definition", i+1)
			}
			b.WriteString(line)
			b.WriteByte('\n')
		case strings.TrimSpace(line) == "" || strings.HasPrefix(line, "--"):
			if cur != nil && strings.TrimSpace(line) == "" {
				b.WriteByte('\n')
			}
			flush()
		default:
			flush()
			var names []string
			if m := luaLocalFn.FindStringSubmatch(line); m != nil {
				names = []string{m[1]}
			} else if m := luaLocalVar.FindStringSubmatch(line); m != nil {
				for n := range strings.SplitSeq(m[1], ",") {
					names = append(names, strings.TrimSpace(n))
				}
			} else {
				return nil, fmt.Errorf("lib.lua:%d: not a local definition: %q", i+1, line)
			}
			cur = &libChunk{names: names}
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	flush()
	return chunks, nil
}

// withLib returns body preceded by the definitions of lib that body uses, directly or through
// other definitions, in lib's order, so that a call of the script does not define every helper
// of the library anew. Both are constant sources of the module, never input. A name counts as
// used when it appears in the code outside strings and comments; a name that appears but is not
// called only adds a definition the script does not need.
func withLib(lib, body string) (string, error) {
	chunks, err := splitLib(lib)
	if err != nil {
		return "", err
	}
	def := map[string]int{} // name -> chunk
	for i, c := range chunks {
		for _, n := range c.names {
			if _, dup := def[n]; dup {
				return "", fmt.Errorf("lib.lua: %s defined twice", n)
			}
			def[n] = i
		}
	}
	need := make([]bool, len(chunks))
	var visit func(text string)
	visit = func(text string) {
		for _, id := range luaIdent.FindAllString(luaNoise.ReplaceAllString(text, " "), -1) {
			if i, ok := def[id]; ok && !need[i] {
				need[i] = true
				visit(chunks[i].text)
			}
		}
	}
	visit(body)
	var b strings.Builder
	for i, c := range chunks {
		if need[i] {
			b.WriteString(c.text)
		}
	}
	b.WriteString(body)
	return b.String(), nil
}
