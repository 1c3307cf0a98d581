package stock_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

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
