// Package lua holds the Redis scripts of package stock as embedded source text. It exists only
// because an embed directive cannot reach a parent directory: package stock reads its scripts
// through it. It is not meant to be used on its own.
package lua

import "embed"

//go:embed *.lua
var files embed.FS

// Source returns the text of the script file name ("deduct.lua", "lib.lua", ...). It panics
// when there is no such file: the names are constants of package stock, never input.
func Source(name string) string {
	b, err := files.ReadFile(name)
	if err != nil {
		panic("stock/lua: " + err.Error())
	}
	return string(b)
}

// Names returns the names of every script file, lib.lua included, in lexical order.
func Names() []string {
	es, err := files.ReadDir(".")
	if err != nil {
		panic("stock/lua: " + err.Error())
	}
	out := make([]string, 0, len(es))
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}
