// Command testreport reads the output of `go test -json` on its standard input, for one or more
// packages and modules, and prints what a person reads: each package's result line, the full
// output of every failed test and of every package that did not build, the slowest tests of the
// run, and a closing count. It exits 1 when a test or a package failed, or when no test ran.
//
//	go test -json ./... | go run ./.ci/testreport -module . -top 25
//
// With -merge FILE... it reads earlier runs' JSON files instead (one per module, the module named
// by the file's base name) and prints only the slowest tests and the count: .ci/test uses it for
// the table of the whole run.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

type event struct {
	Time    time.Time
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

type result struct {
	module, pkg, test string
	elapsed           float64
}

type report struct {
	// start and end: for each top-level test (package, name), when it started and when it or
	// the last of its subtests ended. A parent's Elapsed leaves out its parallel subtests.
	start, end              map[[2]string]time.Time
	passed, failed, skipped int
	pkgFailed               []string
	tests                   []result
	output                  map[string][]string // package/test -> output lines, until the test passes
	sawTest                 bool
}

func newReport() *report {
	return &report{output: map[string][]string{}, start: map[[2]string]time.Time{}, end: map[[2]string]time.Time{}}
}

// read consumes one go test -json stream; with echo it prints package results and failures as
// they come.
func (r *report) read(in io.Reader, module string, echo bool) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil || e.Action == "" {
			// go test prints build errors and the like as plain text.
			if echo {
				fmt.Println(string(line))
			}
			continue
		}
		key := e.Package + "\x00" + e.Test
		top := [2]string{e.Package, strings.SplitN(e.Test, "/", 2)[0]}
		switch e.Action {
		case "run":
			if !strings.Contains(e.Test, "/") {
				r.start[top] = e.Time
			}
		case "output":
			r.output[key] = append(r.output[key], e.Output)
		case "pass", "fail", "skip":
			if e.Test == "" {
				if echo {
					r.echoPackage(e)
				}
				if e.Action == "fail" {
					r.pkgFailed = append(r.pkgFailed, e.Package)
				}
				delete(r.output, key)
				continue
			}
			r.sawTest = true
			if e.Time.After(r.end[top]) {
				r.end[top] = e.Time
			}
			switch e.Action {
			case "pass":
				r.passed++
			case "fail":
				r.failed++
				if echo {
					fmt.Printf("--- FAIL: %s (%s, %.1fs)\n%s", e.Test, e.Package, e.Elapsed, strings.Join(r.output[key], ""))
				}
			case "skip":
				r.skipped++
			}
			delete(r.output, key)
			r.tests = append(r.tests, result{module, e.Package, e.Test, e.Elapsed})
		}
	}
	return sc.Err()
}

func (r *report) echoPackage(e event) {
	key := e.Package + "\x00"
	switch e.Action {
	case "pass":
		fmt.Printf("ok   %s\t%.1fs\n", e.Package, e.Elapsed)
	case "skip":
		fmt.Printf("?    %s\t[no test files]\n", e.Package)
	case "fail":
		// The package's own output (a panic, a timeout, TestMain's words) after its tests.
		fmt.Print(strings.Join(r.output[key], ""))
		fmt.Printf("FAIL %s\t%.1fs\n", e.Package, e.Elapsed)
	}
}

// slowest prints the top n top-level tests by time (subtests are inside their parent's time).
func (r *report) slowest(n int) {
	var top []result
	for _, t := range r.tests {
		if !strings.Contains(t.test, "/") {
			k := [2]string{t.pkg, t.test}
			if s, e := r.start[k], r.end[k]; !s.IsZero() && e.Sub(s).Seconds() > t.elapsed {
				t.elapsed = e.Sub(s).Seconds() // wall time, parallel subtests included
			}
			top = append(top, t)
		}
	}
	sort.Slice(top, func(i, j int) bool { return top[i].elapsed > top[j].elapsed })
	if len(top) > n {
		top = top[:n]
	}
	if len(top) == 0 {
		return
	}
	fmt.Printf("\nthe %d slowest tests:\n%8s  %-14s %-40s %s\n", len(top), "seconds", "module", "package", "test")
	for _, t := range top {
		fmt.Printf("%8.1f  %-14s %-40s %s\n", t.elapsed, t.module, shortPkg(t.pkg), t.test)
	}
}

func shortPkg(p string) string {
	if p == "github.com/stockres/stock" {
		return "stock"
	}
	return strings.TrimPrefix(p, "github.com/stockres/stock/")
}

func main() {
	module := flag.String("module", ".", "the module's name in the slowest-tests table")
	top := flag.Int("top", 25, "how many of the slowest tests to print")
	merge := flag.Bool("merge", false, "read the JSON files named as arguments (one per module) instead of standard input")
	flag.Parse()
	r := newReport()
	if *merge {
		for _, f := range flag.Args() {
			fh, err := os.Open(f)
			if err != nil {
				fmt.Fprintln(os.Stderr, "testreport:", err)
				os.Exit(2)
			}
			err = r.read(fh, strings.TrimSuffix(filepath.Base(f), ".json"), false)
			fh.Close()
			if err != nil {
				fmt.Fprintln(os.Stderr, "testreport:", f, err)
				os.Exit(2)
			}
		}
	} else if err := r.read(os.Stdin, *module, true); err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
	r.slowest(*top)
	fmt.Printf("\ntests: %d passed, %d failed, %d skipped\n", r.passed, r.failed, r.skipped)
	switch {
	case r.failed > 0 || len(r.pkgFailed) > 0:
		if len(r.pkgFailed) > 0 {
			fmt.Printf("failed packages: %s\n", strings.Join(r.pkgFailed, " "))
		}
		os.Exit(1)
	case !r.sawTest && *merge:
		fmt.Println("testreport: no test ran")
		os.Exit(1)
	}
}
