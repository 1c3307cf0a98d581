// Command mutate is the mutation check (.ci/mutants runs it): it applies each mutant of
// .ci/mutants.txt, a one-line change to a script or to the Go code that breaks a promise of the
// package, in a scratch copy of the tree, one at a time, runs the quick tier's tests of the
// packages that can catch it, and says whether a test failed (CAUGHT, naming the first failing
// test) or none did (SURVIVED). A mutant whose original text is no longer in its file (the code
// moved) is STALE, one whose text is in the file more than once AMBIGUOUS, and a Go mutant that
// does not build BROKEN: each of those is a fault of the list, and fails the run as a survivor
// does. The working tree is never changed: the scratch copy is a temporary directory, removed
// at the end or when the run is interrupted.
//
//	go run ./.ci/mutate                  # every mutant, after a baseline run of the unmutated copy
//	go run ./.ci/mutate NAME...          # the mutants named
//	go run ./.ci/mutate -list            # the list: name, file:line, the promise it breaks
//
// The tests run as the quick tier runs them: miniredis and SQLite, every STOCK_* variable of the
// environment removed (a mutant may set its own with env:). Each package of the mutant's list
// (by default the root package, then internal/engine, stockops and systest) runs with -count=1 -failfast, in
// turn, until one fails. The output of each go test is kept in the -out directory.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"
)

// runPattern is the -run flag: when set, only the tests it matches run.
var runPattern string

// defaultPkgs are the packages whose quick-tier tests run against a mutant, in this order.
var defaultPkgs = []string{".", "./internal/engine", "./stockops", "./systest/..."}

type mutant struct {
	name, file, promise string
	orig, repl          string
	env                 []string
	pkgs                []string
	at                  int // the line of mutants.txt that starts it
}

// result is what a mutant's run found.
type result struct {
	m      *mutant
	line   int    // the mutated line of the file (0 when not found)
	status string // CAUGHT, SURVIVED, STALE, AMBIGUOUS, BROKEN
	by     string // the first failing test (CAUGHT), or a note
	pkg    string // the package whose tests caught it
	took   time.Duration
}

func main() {
	list := flag.Bool("list", false, "print the mutants (name, file:line, the promise each breaks) and exit")
	listFile := flag.String("mutants", ".ci/mutants.txt", "the list of mutants")
	out := flag.String("out", "", "where to keep each go test's output (default: a temporary directory)")
	timeout := flag.Duration("timeout", 15*time.Minute, "go test -timeout of each package run (after a baseline, a mutant's run of a package gets 3 times the package's baseline time, at least 2 minutes, at most this)")
	noBaseline := flag.Bool("nobaseline", false, "skip the run of the unmutated copy (it checks that every package passes before any mutant runs)")
	flag.StringVar(&runPattern, "run", "", "go test -run of every package run: while writing a mutant, the test you expect to catch it")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: .ci/mutants [-list] [-nobaseline] [-run REGEXP] [-timeout D] [-out DIR] [NAME...]\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	os.Exit(run(*listFile, *list, *out, *timeout, !*noBaseline, flag.Args()))
}

func run(listFile string, list bool, out string, timeout time.Duration, baseline bool, names []string) int {
	ms, err := parse(listFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mutants:", err)
		return 2
	}
	if list {
		stale := 0
		for _, m := range ms {
			line, n := locate(m)
			note := ""
			switch {
			case n == 0:
				note, stale = "   STALE: the original text is not in the file", stale+1
			case n > 1:
				note, stale = fmt.Sprintf("   AMBIGUOUS: the original text is in the file %d times", n), stale+1
			}
			fmt.Printf("%-32s %s:%d%s\n    %s\n", m.name, m.file, line, note, m.promise)
		}
		if stale > 0 {
			return 1
		}
		return 0
	}
	if len(names) > 0 {
		byName := map[string]*mutant{}
		for _, m := range ms {
			byName[m.name] = m
		}
		var pick []*mutant
		for _, n := range names {
			m, ok := byName[n]
			if !ok {
				fmt.Fprintf(os.Stderr, "mutants: no mutant named %q in %s (-list lists them)\n", n, listFile)
				return 2
			}
			pick = append(pick, m)
		}
		ms = pick
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	started := time.Now()
	if out == "" {
		out, err = os.MkdirTemp("", "mutants-out-")
	} else {
		err = os.MkdirAll(out, 0o755)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mutants:", err)
		return 2
	}
	scratch, err := os.MkdirTemp("", "mutants-tree-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "mutants:", err)
		return 2
	}
	defer os.RemoveAll(scratch)
	if err := copyTree(scratch); err != nil {
		fmt.Fprintln(os.Stderr, "mutants: copying the tree:", err)
		return 2
	}
	fmt.Printf("mutants: %d mutants from %s, in a copy of the tree at %s; go test output in %s\n", len(ms), listFile, scratch, out)

	// limit is each package's go test -timeout for the mutants: a mutant that makes a test hang
	// (a wait for a hold that never expires) is caught by the timeout, in a few times the
	// package's own time rather than the whole -timeout.
	limit := map[string]time.Duration{}
	if baseline {
		fmt.Printf("mutants: baseline: the unmutated copy must pass %s\n", strings.Join(defaultPkgs, " "))
		for _, p := range defaultPkgs {
			t0 := time.Now()
			failed, first, logf, err := goTest(ctx, scratch, out, "baseline", p, nil, timeout)
			if ctx.Err() != nil {
				fmt.Fprintln(os.Stderr, "mutants: interrupted; the scratch copy is removed, the working tree was never changed")
				return 1
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, "mutants:", err)
				return 2
			}
			if failed {
				fmt.Fprintf(os.Stderr, "mutants: the baseline fails in %s (%s; see %s): fix that before judging any mutant\n", p, first, logf)
				return 1
			}
			limit[p] = min(timeout, max(2*time.Minute, 3*time.Since(t0).Round(time.Second)))
			fmt.Printf("mutants: baseline: %s ok in %s (a mutant's run of it times out after %s)\n", p, time.Since(t0).Round(time.Second), limit[p])
		}
	}

	var results []result
	for i, m := range ms {
		if ctx.Err() != nil {
			break
		}
		r := check(ctx, scratch, out, m, limit, timeout)
		if ctx.Err() != nil {
			break
		}
		note := r.by
		if r.pkg != "" {
			note += " (" + r.pkg + ")"
		}
		fmt.Printf("[%d/%d] %s: %s in %s: %s\n", i+1, len(ms), m.name, r.status, r.took.Round(time.Second), note)
		results = append(results, r)
	}
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "mutants: interrupted; the scratch copy is removed, the working tree was never changed")
		return 1
	}

	fmt.Printf("\n%-32s %-24s %-10s %6s   %s\n", "mutant", "file:line", "result", "time", "first failing test (package) / note")
	bad := 0
	count := map[string]int{}
	for _, r := range results {
		count[r.status]++
		if r.status != "CAUGHT" {
			bad++
		}
		note := r.by
		if r.pkg != "" {
			note += " (" + r.pkg + ")"
		}
		fmt.Printf("%-32s %-24s %-10s %6s   %s\n", r.m.name, fmt.Sprintf("%s:%d", r.m.file, r.line), r.status, r.took.Round(time.Second), note)
	}
	fmt.Printf("\nmutants: %d caught, %d survived, %d stale, %d ambiguous, %d broken, of %d, in %s\n",
		count["CAUGHT"], count["SURVIVED"], count["STALE"], count["AMBIGUOUS"], count["BROKEN"], len(results), time.Since(started).Round(time.Second))
	if bad > 0 {
		fmt.Fprintf(os.Stderr, "mutants: FAILED: %d of %d mutants not caught by the quick tier (a survivor is a promise no test guards; a stale or ambiguous mutant is a list to update: see docs/testing.md)\n", bad, len(results))
		return 1
	}
	return 0
}

// check applies m in the scratch copy, runs its packages' tests until one fails, and puts the
// file back.
func check(ctx context.Context, scratch, out string, m *mutant, limit map[string]time.Duration, timeout time.Duration) result {
	t0 := time.Now()
	r := result{m: m}
	path := filepath.Join(scratch, m.file)
	src, err := os.ReadFile(path)
	if err != nil {
		r.status, r.by = "STALE", "file not found: "+m.file
		return r
	}
	n := strings.Count(string(src), m.orig)
	r.line = lineOf(src, m.orig)
	switch {
	case n == 0:
		r.status, r.by = "STALE", "the original text is not in the file (the code moved: update the mutant)"
		return r
	case n > 1:
		r.status, r.by = "AMBIGUOUS", fmt.Sprintf("the original text is in the file %d times (make it longer)", n)
		return r
	}
	mutated := strings.Replace(string(src), m.orig, m.repl, 1)
	if err := os.WriteFile(path, []byte(mutated), 0o644); err != nil {
		r.status, r.by = "BROKEN", err.Error()
		return r
	}
	defer os.WriteFile(path, src, 0o644) //nolint:errcheck // the copy is removed at the end
	pkgs := m.pkgs
	if len(pkgs) == 0 {
		pkgs = defaultPkgs
	}
	for _, p := range pkgs {
		d, ok := limit[p]
		if !ok {
			d = timeout
		}
		failed, first, logf, err := goTest(ctx, scratch, out, m.name, p, m.env, d)
		if err != nil {
			r.status, r.by = "BROKEN", err.Error()
			break
		}
		if failed {
			if strings.HasPrefix(first, "build failed") {
				r.status, r.by = "BROKEN", "does not build: "+logf
			} else {
				r.status, r.by, r.pkg = "CAUGHT", first, p
			}
			break
		}
	}
	if r.status == "" {
		r.status, r.by = "SURVIVED", "no test of "+strings.Join(pkgs, " ")+" failed"
	}
	r.took = time.Since(t0)
	return r
}

var (
	failLine  = regexp.MustCompile(`(?m)^--- FAIL: (\S+)`)
	failAt    = regexp.MustCompile(`(?m)^\s+(\w+_test\.go:\d+): `)
	timedOut  = regexp.MustCompile(`(?m)^panic: test timed out after .*\n\s+running tests:\n\s+(\S+)`)
	panicLine = regexp.MustCompile(`(?m)^panic: (.*)$`)
	buildFail = regexp.MustCompile(`(?m)\[(build|setup) failed\]`)
)

// goTest runs the quick tier's go test of one package of the scratch copy, its output kept in
// out. It reports whether it failed and the first failing test.
func goTest(ctx context.Context, dir, out, name, pkg string, env []string, timeout time.Duration) (failed bool, first, logf string, err error) {
	logf = filepath.Join(out, name+"-"+strings.Trim(strings.ReplaceAll(pkg, "/", "_"), "._")+".log")
	if pkg == "." {
		logf = filepath.Join(out, name+"-root.log")
	}
	args := []string{"test", "-count=1", "-failfast", "-timeout", timeout.String()}
	if runPattern != "" {
		args = append(args, "-run", runPattern)
	}
	cmd := exec.CommandContext(ctx, "go", append(args, pkg)...)
	cmd.Dir = dir
	cmd.Env = append(quickEnv(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) } // the test binary too
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	runErr := cmd.Run()
	if werr := os.WriteFile(logf, buf.Bytes(), 0o644); werr != nil {
		return false, "", logf, werr
	}
	if runErr == nil {
		return false, "", logf, nil
	}
	var ee *exec.ExitError
	if !errors.As(runErr, &ee) {
		return false, "", logf, fmt.Errorf("go test %s: %v", pkg, runErr)
	}
	switch {
	case buildFail.Match(buf.Bytes()):
		first = "build failed"
	case failLine.Match(buf.Bytes()):
		loc := failLine.FindSubmatchIndex(buf.Bytes())
		first = string(buf.Bytes()[loc[2]:loc[3]])
		// The first assertion that failed, in the failing test's output after its name.
		if at := failAt.FindSubmatch(buf.Bytes()[loc[1]:]); at != nil {
			first += " at " + string(at[1])
		}
	case timedOut.Match(buf.Bytes()):
		first = "timed out in " + string(timedOut.FindSubmatch(buf.Bytes())[1])
	case panicLine.Match(buf.Bytes()):
		first = "panic: " + string(panicLine.FindSubmatch(buf.Bytes())[1])
	default:
		first = "go test failed (" + ee.String() + ")"
	}
	return true, first, logf, nil
}

// quickEnv is the environment without the variables that switch the real-server suites on: the
// quick tier's.
func quickEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "STOCK_") {
			env = append(env, kv)
		}
	}
	return env
}

// copyTree copies the files git knows of (tracked, and untracked but not ignored: the tree as
// it is now, uncommitted changes included) into dir.
func copyTree(dir string) error {
	ls, err := exec.Command("git", "ls-files", "-z", "-c", "-o", "--exclude-standard").Output()
	if err != nil {
		return fmt.Errorf("git ls-files: %v", err)
	}
	for _, f := range strings.Split(strings.TrimRight(string(ls), "\x00"), "\x00") {
		fi, err := os.Lstat(f)
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted in the working tree
		} else if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			continue
		}
		dst := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := copyFile(f, dst, fi.Mode().Perm()); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string, perm os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	o, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(o, in); err != nil {
		o.Close()
		return err
	}
	return o.Close()
}

// locate returns the line of the working tree's file where m applies (0 when it does not, and
// the number of places it matches).
func locate(m *mutant) (line, n int) {
	src, err := os.ReadFile(m.file)
	if err != nil {
		return 0, 0
	}
	return lineOf(src, m.orig), strings.Count(string(src), m.orig)
}

func lineOf(src []byte, s string) int {
	i := bytes.Index(src, []byte(s))
	if i < 0 {
		return 0
	}
	return bytes.Count(src[:i], []byte("\n")) + 1
}

// parse reads the list of mutants. Each starts with "name:" and has these lines:
//
//	name: NAME            a word: letters, digits, '-'
//	file: PATH            relative to the root of the tree
//	promise: TEXT         the promise the mutant breaks
//	env: K=V              optional, repeatable: a variable the tests of this mutant get
//	pkgs: PKG...          optional: the packages to run, in order (default: . ./stockops ./systest/...)
//	- TEXT                the original text, exactly (after "- "), within one line of the file
//	+ TEXT                its replacement (after "+ "; "+" alone removes the text)
//
// Lines starting with '#' and blank lines are ignored.
func parse(path string) ([]*mutant, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ms []*mutant
	var m *mutant
	seen := map[string]bool{}
	haveOrig, haveRepl := false, false
	finish := func() error {
		if m == nil {
			return nil
		}
		switch {
		case m.file == "":
			return fmt.Errorf("%s:%d: mutant %s has no line \"file: PATH\"", path, m.at, m.name)
		case m.promise == "":
			return fmt.Errorf("%s:%d: mutant %s has no line \"promise: TEXT\"", path, m.at, m.name)
		case !haveOrig || m.orig == "":
			return fmt.Errorf("%s:%d: mutant %s has no original text (a line \"- TEXT\")", path, m.at, m.name)
		case !haveRepl:
			return fmt.Errorf("%s:%d: mutant %s has no replacement (a line \"+ TEXT\")", path, m.at, m.name)
		case m.orig == m.repl:
			return fmt.Errorf("%s:%d: mutant %s changes nothing", path, m.at, m.name)
		}
		ms = append(ms, m)
		return nil
	}
	name := regexp.MustCompile(`^[A-Za-z0-9-]+$`)
	sc := bufio.NewScanner(f)
	for ln := 1; sc.Scan(); ln++ {
		l := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if v, ok := strings.CutPrefix(l, "name:"); ok {
			if err := finish(); err != nil {
				return nil, err
			}
			v = strings.TrimSpace(v)
			if !name.MatchString(v) {
				return nil, fmt.Errorf("%s:%d: a mutant's name is letters, digits and '-': %q", path, ln, v)
			}
			if seen[v] {
				return nil, fmt.Errorf("%s:%d: a second mutant named %s", path, ln, v)
			}
			seen[v] = true
			m, haveOrig, haveRepl = &mutant{name: v, at: ln}, false, false
			continue
		}
		if m == nil {
			return nil, fmt.Errorf("%s:%d: %q before the first line \"name: NAME\"", path, ln, l)
		}
		switch {
		case strings.HasPrefix(l, "file:"):
			m.file = strings.TrimSpace(strings.TrimPrefix(l, "file:"))
		case strings.HasPrefix(l, "promise:"):
			m.promise = strings.TrimSpace(strings.TrimPrefix(l, "promise:"))
		case strings.HasPrefix(l, "env:"):
			kv := strings.TrimSpace(strings.TrimPrefix(l, "env:"))
			if !strings.Contains(kv, "=") {
				return nil, fmt.Errorf("%s:%d: env: wants K=V", path, ln)
			}
			m.env = append(m.env, kv)
		case strings.HasPrefix(l, "pkgs:"):
			m.pkgs = strings.Fields(strings.TrimPrefix(l, "pkgs:"))
		case l == "-" || strings.HasPrefix(l, "- "):
			if haveOrig {
				return nil, fmt.Errorf("%s:%d: mutant %s has a second original line: a mutant is a one-line change", path, ln, m.name)
			}
			m.orig, haveOrig = strings.TrimPrefix(strings.TrimPrefix(l, "-"), " "), true
		case l == "+" || strings.HasPrefix(l, "+ "):
			if haveRepl {
				return nil, fmt.Errorf("%s:%d: mutant %s has a second replacement line: a mutant is a one-line change", path, ln, m.name)
			}
			m.repl, haveRepl = strings.TrimPrefix(strings.TrimPrefix(l, "+"), " "), true
		default:
			return nil, fmt.Errorf("%s:%d: mutant %s: unknown line %q", path, ln, m.name, l)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if err := finish(); err != nil {
		return nil, err
	}
	if len(ms) == 0 {
		return nil, fmt.Errorf("%s: no mutants", path)
	}
	return ms, nil
}
