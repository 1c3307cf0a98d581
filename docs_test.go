package stock_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The documentation's Go snippets are compiled: every ```go block of README.md and docs/*.md is
// type-checked (go vet) in a module of a temporary workspace that uses every module of this
// repository's go.work, so a snippet cannot drift from the API. A block is one of:
//
//   - a whole file: it starts with a package clause and has its own imports;
//   - declarations (it starts with func, type, var or const): put in a file that imports
//     docImports;
//   - statements: the body of a function that returns an error, with ctx context.Context,
//     client rueidis.Client, r *stock.Reserver, store stock.Store and db *sql.DB in scope, in
//     a file that imports docImports.
//
// Errors point at the Markdown file and line (//line directives). Every block must also be as
// gofmt formats it (statements one tab in, as a function's body). Blocks that are not Go take
// another fence tag (```sh, ```text, ```sql); a fence without a tag is an error, so that a Go
// block cannot go unchecked for want of one.

// docImports are the packages a snippet that is not a whole file may use, each with a name of
// it that keeps the import used.
var docImports = [][2]string{
	{"context", "context.Background"},
	{"database/sql", "sql.Open"},
	{"errors", "errors.Is"},
	{"fmt", "fmt.Sprint"},
	{"log", "log.Print"},
	{"log/slog", "slog.Default"},
	{"net/http", "http.StatusOK"},
	{"os", "os.Getenv"},
	{"strings", "strings.HasPrefix"},
	{"testing", "testing.Short"},
	{"time", "time.Second"},
	{"github.com/redis/rueidis", "rueidis.NewClient"},
	{"github.com/stockres/stock", "stock.New"},
	{"github.com/stockres/stock/memstore", "memstore.New"},
	{"github.com/stockres/stock/sqlstore", "sqlstore.New"},
	{"github.com/stockres/stock/stockops", "stockops.Sweep"},
	{"github.com/stockres/stock/stockotel", "stockotel.New"},
	{"github.com/stockres/stock/stocktest", "stocktest.New"},
	{"go.opentelemetry.io/otel", "otel.GetMeterProvider"},
}

// docBlock is one fenced block of a Markdown file.
type docBlock struct {
	file string // path relative to the repository's root
	line int    // line of the block's first line of code
	tag  string // the fence's info string, first word
	code string
}

var fenceRE = regexp.MustCompile("^(\\s*)(```+)\\s*(\\S*)")

// docFiles are the Markdown files whose snippets are checked.
func docFiles(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("docs/*.md")
	require.NoError(t, err)
	return append([]string{"README.md"}, pages...)
}

// readBlocks returns the fenced blocks of file, with their indentation removed.
func readBlocks(t *testing.T, file string) []docBlock {
	t.Helper()
	f, err := os.Open(file)
	require.NoError(t, err)
	defer f.Close()
	var blocks []docBlock
	var cur *docBlock
	var indent, fence string
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if cur == nil {
			if m := fenceRE.FindStringSubmatch(line); m != nil {
				if m[3] == "" {
					t.Errorf("%s:%d: a fenced block without a tag: tag Go ```go, anything else ```sh, ```text, ...", file, n)
				}
				cur = &docBlock{file: file, line: n + 1, tag: m[3]}
				indent, fence = m[1], m[2]
			}
			continue
		}
		if s := strings.TrimSpace(line); strings.HasPrefix(s, fence) && strings.Trim(s, "`") == "" {
			blocks = append(blocks, *cur)
			cur = nil
			continue
		}
		cur.code += strings.TrimPrefix(line, indent) + "\n"
	}
	require.NoError(t, sc.Err())
	if cur != nil {
		t.Errorf("%s:%d: a fenced block is never closed", file, cur.line-1)
	}
	return blocks
}

// snippetKind says what a Go block is: "file", "decls" or "stmts", by its first line that is
// not blank or a comment.
func snippetKind(code string) string {
	for _, l := range strings.Split(code, "\n") {
		s := strings.TrimSpace(l)
		if s == "" || strings.HasPrefix(s, "//") {
			continue
		}
		if strings.HasPrefix(s, "package ") {
			return "file"
		}
		for _, kw := range []string{"func ", "type ", "var ", "const "} {
			if strings.HasPrefix(s, kw) {
				return "decls"
			}
		}
		break
	}
	return "stmts"
}

// snippetSource makes a Go file of b; abs is the Markdown file's absolute path, for the
// //line directives.
func snippetSource(b docBlock, abs string) string {
	directive := fmt.Sprintf("//line %s:%d\n", abs, b.line)
	kind := snippetKind(b.code)
	if kind == "file" {
		return directive + b.code
	}
	var src strings.Builder
	src.WriteString("package snippet\n\nimport (\n")
	for _, imp := range docImports {
		fmt.Fprintf(&src, "\t%q\n", imp[0])
	}
	src.WriteString(")\n\n")
	for _, imp := range docImports {
		fmt.Fprintf(&src, "var _ = %s\n", imp[1])
	}
	src.WriteString("\n")
	if kind == "decls" {
		src.WriteString(directive + b.code)
		return src.String()
	}
	// "if true": the block may end in a return, and the return after it stays reachable.
	src.WriteString("func _(ctx context.Context, client rueidis.Client, r *stock.Reserver, store stock.Store, db *sql.DB) error {\nif true {\n")
	src.WriteString(directive + b.code)
	src.WriteString("}\nreturn nil\n}\n")
	return src.String()
}

// gofmtBlock says how b differs from its gofmt'ed form ("" when it does not). Statements are
// formatted as a function's body, one tab in.
func gofmtBlock(b docBlock) string {
	src := b.code
	kind := snippetKind(b.code)
	switch kind {
	case "decls":
		src = "package p\n\n" + src
	case "stmts":
		var body strings.Builder
		for _, l := range strings.SplitAfter(strings.TrimSuffix(src, "\n"), "\n") {
			if strings.TrimSpace(l) != "" {
				body.WriteString("\t")
			}
			body.WriteString(l)
		}
		src = "package p\n\nfunc _() {\n" + body.String() + "\n}\n"
	}
	out, err := format.Source([]byte(src))
	if err != nil {
		return err.Error()
	}
	if string(out) == src {
		return ""
	}
	a, o := strings.Split(src, "\n"), strings.Split(string(out), "\n")
	for i := range a {
		if i >= len(o) || a[i] != o[i] {
			if i < len(o) {
				return fmt.Sprintf("%q should be %q", a[i], o[i])
			}
			return fmt.Sprintf("%q", a[i])
		}
	}
	return "lines differ"
}

func TestDocsSnippetsCompile(t *testing.T) {
	root, err := os.Getwd()
	require.NoError(t, err)
	if _, err := os.Stat(filepath.Join(root, "go.work")); err != nil {
		t.Skip("no go.work: not a checkout of the repository")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go binary on PATH")
	}
	var blocks []docBlock
	for _, f := range docFiles(t) {
		for _, b := range readBlocks(t, f) {
			if b.tag == "go" {
				blocks = append(blocks, b)
			}
		}
	}
	if len(blocks) == 0 {
		t.Fatal("no ```go block found in README.md and docs/")
	}
	for _, b := range blocks {
		msg := gofmtBlock(b)
		assert.EqualValues(t, "", msg, "%s:%d: the Go block is not gofmt'ed: %s", b.file, b.line, msg)
	}

	// A workspace of its own: this repository's modules and the snippets' module.
	out, err := exec.Command(goBin, "work", "edit", "-json", filepath.Join(root, "go.work")).Output()
	require.NoError(t, err, "go work edit -json")
	var work struct {
		Go  string
		Use []struct{ DiskPath string }
	}
	require.NoError(t, json.Unmarshal(out, &work))
	dir := t.TempDir()
	var ws strings.Builder
	fmt.Fprintf(&ws, "go %s\n\nuse (\n\t./snippets\n", work.Go)
	for _, u := range work.Use {
		fmt.Fprintf(&ws, "\t%s\n", filepath.Join(root, u.DiskPath))
	}
	ws.WriteString(")\n")
	write := func(name, content string) {
		t.Helper()
		p := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	}
	write("go.work", ws.String())
	if sum, err := os.ReadFile(filepath.Join(root, "go.work.sum")); err == nil {
		write("go.work.sum", string(sum))
	}
	write("snippets/go.mod", "module docsnippets\n\ngo "+work.Go+"\n")
	for i, b := range blocks {
		write(fmt.Sprintf("snippets/s%03d/snippet.go", i), snippetSource(b, filepath.Join(root, b.file)))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "vet", "./...")
	cmd.Dir = filepath.Join(dir, "snippets")
	cmd.Env = append(os.Environ(), "GOWORK="+filepath.Join(dir, "go.work"), "GOFLAGS=-mod=readonly")
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Run(); err != nil {
		t.Fatalf("the Go snippets of the documentation do not compile (%v):\n%s", err, buf.String())
	}
	t.Logf("%d Go snippets compiled", len(blocks))
}

// TestDocsShape checks the front door's limits: a short README that links every guide, and
// no guide over 400 lines.
func TestDocsShape(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	if n := bytes.Count(readme, []byte("\n")); n > 250 {
		t.Errorf("README.md has %d lines, more than 250: move the depth to a page of docs/", n)
	}
	pages, err := filepath.Glob("docs/*.md")
	require.NoError(t, err)
	for _, p := range pages {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		if n := bytes.Count(b, []byte("\n")); n > 400 {
			t.Errorf("%s has %d lines, more than 400: split it", p, n)
		}
		if !bytes.Contains(readme, []byte("("+filepath.ToSlash(p)+")")) {
			t.Errorf("README.md does not link %s", p)
		}
	}
}

var (
	linkRE    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingRE = regexp.MustCompile(`^#{1,6}\s+(.*)$`)
)

// anchors returns the anchors GitHub gives the headings of a Markdown file.
func anchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	a := map[string]bool{}
	inFence := false
	for _, line := range strings.Split(readFile(t, file), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
		}
		m := headingRE.FindStringSubmatch(line)
		if inFence || m == nil {
			continue
		}
		var b strings.Builder
		for _, c := range strings.ToLower(m[1]) {
			switch {
			case c == ' ':
				b.WriteRune('-')
			case c == '-' || c == '_' || unicode.IsLetter(c) || unicode.IsDigit(c):
				b.WriteRune(c)
			}
		}
		a[b.String()] = true
	}
	return a
}

func readFile(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	return string(b)
}

// TestDocsLinks checks that every relative link of README.md and docs/*.md names a file of the
// repository, and, into a Markdown file, one of its headings.
func TestDocsLinks(t *testing.T) {
	for _, f := range docFiles(t) {
		inFence := false
		for n, line := range strings.Split(readFile(t, f), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				inFence = !inFence
			}
			if inFence {
				continue
			}
			for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, anchor, _ := strings.Cut(target, "#")
				file := f
				if path != "" {
					file = filepath.Join(filepath.Dir(f), filepath.FromSlash(path))
					if _, err := os.Stat(file); err != nil {
						t.Errorf("%s:%d: link to %s: no such file", f, n+1, target)
						continue
					}
				}
				if anchor != "" && strings.HasSuffix(file, ".md") && !anchors(t, file)[anchor] {
					t.Errorf("%s:%d: link to %s: no heading of %s has the anchor #%s", f, n+1, target, file, anchor)
				}
			}
		}
	}
}

// TestHTTPCheckoutMatchesExample keeps docs/http-checkout.md and examples/checkout saying the
// same: for every outcome the example's stockError maps, the page's table gives the same HTTP
// status and error code, and the page's status function the same status; and the page names
// no outcome the example does not map.
func TestHTTPCheckoutMatchesExample(t *testing.T) {
	const page = "docs/http-checkout.md"
	statusOf := map[string]int{}
	for code := 100; code < 600; code++ {
		if text := http.StatusText(code); text != "" {
			statusOf["Status"+strings.NewReplacer(" ", "", "-", "", "'", "").Replace(text)] = code
		}
	}
	statusOf["StatusRequestEntityTooLarge"] = http.StatusRequestEntityTooLarge
	// status returns the HTTP status a composite literal's first element names (http.StatusX).
	status := func(e ast.Expr) int {
		if sel, ok := e.(*ast.SelectorExpr); ok {
			if n, ok := statusOf[sel.Sel.Name]; ok {
				return n
			}
			t.Fatalf("unknown status %s", sel.Sel.Name)
		}
		t.Fatalf("not a status: %T", e)
		return 0
	}

	// The example: outcome -> status and code, from stockError's switch.
	fset := token.NewFileSet()
	src, err := parser.ParseFile(fset, "examples/checkout/server.go", nil, 0)
	require.NoError(t, err)
	vars, funcs := map[string]ast.Expr{}, map[string]*ast.FuncDecl{}
	for _, d := range src.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			funcs[d.Name.Name] = d
		case *ast.GenDecl:
			for _, s := range d.Specs {
				if vs, ok := s.(*ast.ValueSpec); ok {
					for i, n := range vs.Names {
						if i < len(vs.Values) {
							vars[n.Name] = vs.Values[i]
						}
					}
				}
			}
		}
	}
	// lit resolves what a case returns to its apiError literal: a literal, a variable, or a call
	// of a function of the file that returns one.
	var lit func(e ast.Expr) *ast.CompositeLit
	lit = func(e ast.Expr) *ast.CompositeLit {
		switch e := e.(type) {
		case *ast.CompositeLit:
			return e
		case *ast.Ident:
			if v, ok := vars[e.Name]; ok {
				return lit(v)
			}
		case *ast.CallExpr:
			if id, ok := e.Fun.(*ast.Ident); ok && funcs[id.Name] != nil {
				for _, s := range funcs[id.Name].Body.List {
					if r, ok := s.(*ast.ReturnStmt); ok {
						return lit(r.Results[0])
					}
				}
			}
		}
		t.Fatalf("examples/checkout/server.go:%v: cannot resolve %T to an apiError", fset.Position(e.Pos()), e)
		return nil
	}
	type mapping struct {
		status int
		code   string
	}
	example := map[string]mapping{}
	stockError := funcs["stockError"]
	if stockError == nil {
		t.Fatal("examples/checkout/server.go has no func stockError")
	}
	for _, s := range stockError.Body.List {
		sw, ok := s.(*ast.SwitchStmt)
		if !ok {
			if r, ok := s.(*ast.ReturnStmt); ok { // after the switch: every other outcome
				l := lit(r.Results[0])
				example["other"] = mapping{status(l.Elts[0]), strings.Trim(l.Elts[1].(*ast.BasicLit).Value, `"`)}
			}
			continue
		}
		for _, c := range sw.Body.List {
			cc := c.(*ast.CaseClause)
			r, ok := cc.Body[len(cc.Body)-1].(*ast.ReturnStmt)
			if !ok {
				t.Fatalf("stockError: a case that does not end in a return")
			}
			l := lit(r.Results[0])
			m := mapping{status(l.Elts[0]), strings.Trim(l.Elts[1].(*ast.BasicLit).Value, `"`)}
			for _, v := range cc.List {
				example[strings.Trim(v.(*ast.BasicLit).Value, `"`)] = m
			}
		}
	}
	if len(example) < 10 {
		t.Fatalf("read %d outcomes from the example's stockError: %v", len(example), example)
	}

	// The page's table: | `outcome`, ... | status | `code` | ...
	rowRE := regexp.MustCompile("^\\| (.*?) \\| `?(\\d{3})[^|]*\\| (?:`([a-z_]+)`|—) \\|")
	tickRE := regexp.MustCompile("`([a-z_]+)`")
	table := map[string]mapping{}
	for _, line := range strings.Split(readFile(t, page), "\n") {
		m := rowRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		var code int
		fmt.Sscan(m[2], &code)
		names := tickRE.FindAllStringSubmatch(m[1], -1)
		if strings.HasPrefix(m[1], "anything else") {
			names = [][]string{{"", "other"}}
		}
		for _, n := range names {
			table[n[1]] = mapping{code, m[3]}
		}
	}

	// The page's status function.
	var fn *ast.FuncDecl
	for _, b := range readBlocks(t, page) {
		if b.tag != "go" || !strings.Contains(b.code, "func status(") {
			continue
		}
		f, err := parser.ParseFile(fset, page, b.code, 0)
		require.NoError(t, err)
		for _, d := range f.Decls {
			if d, ok := d.(*ast.FuncDecl); ok && d.Name.Name == "status" {
				fn = d
			}
		}
	}
	if fn == nil {
		t.Fatalf("%s: no Go block with func status", page)
	}
	code := map[string]int{}
	for _, s := range fn.Body.List {
		switch s := s.(type) {
		case *ast.SwitchStmt:
			for _, c := range s.Body.List {
				cc := c.(*ast.CaseClause)
				n := status(cc.Body[0].(*ast.ReturnStmt).Results[0])
				for _, v := range cc.List {
					code[strings.Trim(v.(*ast.BasicLit).Value, `"`)] = n
				}
			}
		case *ast.ReturnStmt:
			code["other"] = status(s.Results[0])
		}
	}

	for outcome, want := range example {
		if got, ok := table[outcome]; !ok {
			t.Errorf("%s: the table has no row for the outcome %q (the example answers %d %s)", page, outcome, want.status, want.code)
		} else if got != want {
			t.Errorf("%s: the table answers %q with %d %s, the example with %d %s", page, outcome, got.status, got.code, want.status, want.code)
		}
		if got, ok := code[outcome]; !ok && outcome != "other" {
			if code["other"] != want.status {
				t.Errorf("%s: func status answers %q with %d (its default), the example with %d", page, outcome, code["other"], want.status)
			}
		} else if got != want.status {
			t.Errorf("%s: func status answers %q with %d, the example with %d", page, outcome, got, want.status)
		}
	}
	for outcome := range table {
		if _, ok := example[outcome]; !ok && outcome != "ok" {
			t.Errorf("%s: the table maps %q, which the example's stockError does not", page, outcome)
		}
	}
	for outcome := range code {
		if _, ok := example[outcome]; !ok && outcome != "ok" {
			t.Errorf("%s: func status maps %q, which the example's stockError does not", page, outcome)
		}
	}
	if !t.Failed() {
		t.Logf("%d outcomes: the page's table and status function agree with examples/checkout", len(example))
	}
}

// go doc does not follow a type alias to another package: since the data types moved to
// package stocktype, `go doc stock.Request.Retry` answers "no method or field", and
// `go doc stock.Request` shows one line without the fields, their limits or their defaults.
// Each alias's comment must therefore say where its fields (or methods, or values) are
// documented, as a doc link that go doc and pkg.go.dev show: [stocktype.Request].
func TestEveryAliasOfStocktypeNamesWhereItsFieldsAreDocumented(t *testing.T) {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	var missing, seen []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		require.NoError(t, err)
		f, err := parser.ParseFile(fset, name, src, parser.ParseComments)
		require.NoError(t, err)
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, s := range gd.Specs {
				ts := s.(*ast.TypeSpec)
				sel, ok := ts.Type.(*ast.SelectorExpr)
				if !ts.Assign.IsValid() || !ok {
					continue
				}
				if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "stocktype" {
					continue
				}
				doc := ts.Doc
				if doc == nil && len(gd.Specs) == 1 {
					doc = gd.Doc
				}
				seen = append(seen, ts.Name.Name)
				link := "[stocktype." + sel.Sel.Name + "]"
				if doc == nil || !strings.Contains(doc.Text(), link) {
					missing = append(missing, ts.Name.Name+" (want "+link+")")
				}
			}
		}
	}
	if len(seen) < 20 {
		t.Fatalf("found only %d aliases of stocktype types: %v", len(seen), seen)
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("%d of %d aliases do not say where their fields are documented (go doc cannot follow them):\n  %s",
			len(missing), len(seen), strings.Join(missing, "\n  "))
	}
}
