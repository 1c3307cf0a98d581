// Command stockctl is an operator's tool for the stock reservations of github.com/stockres/stock:
// it loads and restocks items, reads their levels and ledgers, closes, reopens and delists them,
// gives back a request's stock, sweeps expired holds, and, with the database of record (-dsn),
// reconciles Redis with it, adds the store side of an item loaded in Redis only, and drains the
// outbox into it once.
//
// Usage:
//
//	stockctl [global flags] COMMAND [flags] [args]
//
// Run "stockctl help" for the commands and flags, "stockctl help COMMAND" for one of them.
//
// Exit status: 0 on success; 1 when the operation failed (an item not loaded, an unknown id,
// Redis or the database unreachable); 2 on a usage error (a bad flag, a missing argument, a name
// or -prefix the library rejects, a missing -dsn), found before connecting to anything; 3 when reconcile found drift or something that needs a human (with
// -apply: only what it left unrepaired), so that a cron job can alert on it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/stockres/stock"
)

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1 // the operation failed
	exitUsage = 2 // bad flags or arguments
	exitDrift = 3 // reconcile found drift or something for a human (with -apply: left it)
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// globals are the flags every command takes, before or after its name.
type globals struct {
	redis       string
	sentinel    string // name@host:port,...: a Sentinel deployment instead of -redis
	prefix      string
	dsn         string
	tablePrefix string
	json        bool
	timeout     time.Duration
}

func defaultGlobals() globals {
	g := globals{redis: "127.0.0.1:6379", prefix: "stock", tablePrefix: "stock_", timeout: time.Minute}
	if v := os.Getenv("STOCKCTL_REDIS"); v != "" {
		g.redis = v
	}
	if v := os.Getenv("STOCKCTL_SENTINEL"); v != "" {
		g.sentinel = v
	}
	if v := os.Getenv("STOCKCTL_DSN"); v != "" {
		g.dsn = v
	}
	return g
}

// register defines the global flags on fs, with their current values as defaults, so that a
// command's flag set can take them too without resetting what was given before the command.
func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.redis, "redis", g.redis, "Redis at `ADDR`: host:port, a comma-separated list of cluster nodes,\n"+
		"or a redis://, rediss:// or unix:// URL (with a password); env STOCKCTL_REDIS")
	fs.StringVar(&g.sentinel, "sentinel", g.sentinel, "Redis behind Sentinel, at `NAME@ADDRS`: the primary's name and the sentinels'\n"+
		"comma-separated host:port addresses (instead of -redis); env STOCKCTL_SENTINEL")
	fs.StringVar(&g.prefix, "prefix", g.prefix, "key `PREFIX` of the Reserver (stock.WithPrefix)")
	fs.StringVar(&g.dsn, "dsn", g.dsn, "the database of record at `DSN`: postgres://..., mysql://user:pass@host:3306/db?params,\n"+
		"mysql:<go-sql-driver DSN>, or sqlite:PATH; env STOCKCTL_DSN")
	fs.StringVar(&g.tablePrefix, "table-prefix", g.tablePrefix, "table name `PREFIX` in the database (sqlstore.WithTablePrefix)")
	fs.BoolVar(&g.json, "json", g.json, "machine-readable JSON output on stdout")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "give up after this `DURATION`")
}

// command is one subcommand.
type command struct {
	name    string
	args    string // the positional arguments, as shown in usage
	short   string // one line for the command list
	long    string // the help text
	example string
	min     int // positional arguments, at least
	max     int // and at most; -1: no limit
	// dsn says whether the command uses -dsn: not at all, when given, or always.
	dsn dsnUse
	// noRedis marks a command that never connects to Redis (migrate): -prefix is not its
	// business.
	noRedis bool
	// setup defines the command's own flags on fs and returns the function that runs it with
	// the positional arguments.
	setup func(fs *flag.FlagSet) func(ctx context.Context, e *env, args []string) error
}

func (c *command) usage() string {
	u := "stockctl " + c.name
	if c.args != "" {
		u += " " + c.args
	}
	if fl := c.flagNames(); fl != "" {
		u += " " + fl
	}
	return u
}

// flagNames lists the command's own flags for the usage line.
func (c *command) flagNames() string {
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	c.setup(fs)
	var parts []string
	fs.VisitAll(func(f *flag.Flag) {
		name, _ := flag.UnquoteUsage(f)
		if name == "" {
			parts = append(parts, "[-"+f.Name+"]")
		} else {
			parts = append(parts, "[-"+f.Name+" "+name+"]")
		}
	})
	return strings.Join(parts, " ")
}

// dsnUse says what a command does with -dsn.
type dsnUse int

const (
	dsnNone     dsnUse = iota // not used
	dsnOptional               // used when given
	dsnRequired               // a usage error without it (env.needDSN, before connecting)
)

// usageError is a mistake in the command line: exit 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// driftError says that reconcile found something: exit 3. Its report is already printed.
type driftError struct{ msg string }

func (e driftError) Error() string { return e.msg }

// run runs stockctl with args (without the program name) and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	g := defaultGlobals()
	top := flag.NewFlagSet("stockctl", flag.ContinueOnError)
	top.SetOutput(io.Discard)
	g.register(top)
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout)
			return exitOK
		}
		fmt.Fprintf(stderr, "stockctl: %v\nRun 'stockctl help' for usage.\n", err)
		return exitUsage
	}
	if top.NArg() == 0 {
		printUsage(stderr)
		return exitUsage
	}
	name, rest := top.Arg(0), top.Args()[1:]
	if name == "help" {
		return help(rest, stdout, stderr)
	}
	cmd := lookup(name)
	if cmd == nil {
		fmt.Fprintf(stderr, "stockctl: unknown command %q\nRun 'stockctl help' for the list of commands.\n", name)
		return exitUsage
	}

	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	g.register(fs)
	runCmd := cmd.setup(fs)
	pos, err := parseInterleaved(fs, rest)
	if errors.Is(err, flag.ErrHelp) {
		printCommand(stdout, cmd)
		return exitOK
	}
	if err == nil {
		switch {
		case len(pos) < cmd.min:
			err = usagef("missing arguments")
		case cmd.max >= 0 && len(pos) > cmd.max:
			err = usagef("too many arguments")
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "stockctl %s: %v\nusage: %s\nRun 'stockctl help %s' for details.\n", cmd.name, err, cmd.usage(), cmd.name)
		return exitUsage
	}
	if g.timeout <= 0 {
		fmt.Fprintf(stderr, "stockctl %s: -timeout must be positive\n", cmd.name)
		return exitUsage
	}
	// What is wrong whatever Redis and the database say is a usage error before anything is
	// connected: the names, -prefix, a missing or malformed -dsn.
	if err := precheck(cmd, g, pos); err != nil {
		return exitCode(stderr, cmd, err, g)
	}

	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	e := &env{g: g, out: stdout, errOut: stderr}
	defer e.close()
	err = runCmd(ctx, e, pos)
	return exitCode(stderr, cmd, err, g)
}

// precheck refuses, before any connection, a command line that is wrong whatever Redis and the
// database say: a SKU or ID the library rejects, a bad -prefix, and a -dsn that does not parse. (QTY is checked by the commands, also before
// they connect.)
func precheck(cmd *command, g globals, pos []string) error {
	if err := checkArgs(cmd, pos); err != nil {
		return err
	}
	if !cmd.noRedis {
		if err := checkName("-prefix", g.prefix); err != nil {
			return err
		}
	}
	if cmd.dsn != dsnNone && g.dsn != "" {
		if _, _, _, err := parseDSN(g.dsn); err != nil {
			return err
		}
	}
	return nil // a missing -dsn: the command says it after checking its own flags (needDSN)
}

// checkArgs checks the positional arguments that are names (SKU, ID in the command's usage)
// as the library does.
func checkArgs(cmd *command, pos []string) error {
	labels := strings.Fields(strings.NewReplacer("[", "", "]", "", "...", "").Replace(cmd.args))
	for i, a := range pos {
		if len(labels) == 0 {
			break
		}
		l := labels[min(i, len(labels)-1)]
		if l != "SKU" && l != "ID" {
			continue
		}
		if err := checkName(l, a); err != nil {
			return err
		}
	}
	return nil
}

// checkName refuses a name (SKU, request id, -prefix) as the library does (stock's checkName,
// README "Names"): empty, longer than stock.MaxNameLen bytes, not UTF-8, or with a brace, '|',
// whitespace, a control character or a Unicode format character (category Cf). The library checks again; this check only makes the
// refusal a usage error before anything is connected. TestCheckNameAsTheLibrary keeps the two
// in step.
func checkName(what, s string) error {
	switch {
	case s == "":
		return usagef("invalid %s: empty", what)
	case len(s) > stock.MaxNameLen:
		return usagef("invalid %s: %d bytes, longer than %d", what, len(s), stock.MaxNameLen)
	case !utf8.ValidString(s):
		return usagef("invalid %s %q: not valid UTF-8", what, s)
	}
	for i, c := range s {
		if c == '{' || c == '}' || c == '|' || unicode.IsSpace(c) || unicode.IsControl(c) {
			return usagef("invalid %s %q: contains %q (braces, '|', whitespace and control characters are not allowed)", what, s, c)
		}
		if unicode.Is(unicode.Cf, c) {
			return usagef("invalid %s %q: contains the invisible format character U+%04X at byte %d (Unicode format characters are not allowed)", what, s, c, i)
		}
	}
	return nil
}

// exitCode reports err on stderr, with the passwords of g's addresses hidden, and returns the
// exit status it stands for.
func exitCode(stderr io.Writer, cmd *command, err error, g globals) int {
	if err == nil {
		return exitOK
	}
	msg := hideSecrets(err.Error(), g)
	var ue usageError
	var de driftError
	switch {
	case errors.As(err, &de):
		fmt.Fprintf(stderr, "stockctl %s: %s\n", cmd.name, msg)
		return exitDrift
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "stockctl %s: %s\nusage: %s\nRun 'stockctl help %s' for details.\n", cmd.name, msg, cmd.usage(), cmd.name)
		return exitUsage
	case isInvalid(err):
		fmt.Fprintf(stderr, "stockctl %s: %s\n", cmd.name, msg)
		return exitUsage
	}
	fmt.Fprintf(stderr, "stockctl %s: %s\n", cmd.name, msg)
	if missingTable(err) {
		fmt.Fprintf(stderr, "The store's tables are missing: create them once with 'stockctl -dsn DSN migrate' (the same -dsn and -table-prefix).\n")
	}
	return exitFail
}

// missingTable reports whether err is a database's answer that a table does not exist
// (PostgreSQL, MySQL/MariaDB, SQLite), which migrate cures.
func missingTable(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "no such table") || // SQLite
		(strings.Contains(msg, "relation ") && strings.Contains(msg, "does not exist")) || // PostgreSQL
		(strings.Contains(msg, "Table '") && strings.Contains(msg, "doesn't exist")) // MySQL, MariaDB
}

// parseInterleaved parses flags anywhere among the positional arguments ("ledger SKU -limit
// 5"), which package flag alone stops at. Everything after "--" is positional.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func lookup(name string) *command {
	for i := range commands {
		if commands[i].name == name {
			return &commands[i]
		}
	}
	return nil
}

func help(args []string, stdout, stderr io.Writer) int {
	switch len(args) {
	case 0:
		printUsage(stdout)
		return exitOK
	case 1:
		if args[0] == "help" {
			printUsage(stdout)
			return exitOK
		}
		if c := lookup(args[0]); c != nil {
			printCommand(stdout, c)
			return exitOK
		}
		fmt.Fprintf(stderr, "stockctl help: unknown command %q\nRun 'stockctl help' for the list of commands.\n", args[0])
		return exitUsage
	}
	fmt.Fprintln(stderr, "usage: stockctl help [COMMAND]")
	return exitUsage
}

func printUsage(w io.Writer) {
	fmt.Fprint(w, `stockctl operates the stock reservations of github.com/stockres/stock in Redis, and
checks them against the database of record.

Usage:
  stockctl [global flags] COMMAND [flags] [args]

Commands:
`)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s %s\t%s\n", c.name, c.args, c.short)
	}
	fmt.Fprintf(tw, "  help [COMMAND]\tthis text, or a command's help\n")
	tw.Flush()
	fmt.Fprint(w, "\nGlobal flags (before or after the command):\n")
	g := defaultGlobals()
	fs := flag.NewFlagSet("stockctl", flag.ContinueOnError)
	g.register(fs)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fmt.Fprint(w, `
Exit status: 0 ok; 1 the operation failed (not loaded, unknown id, Redis or the database
unreachable); 2 usage error (a bad flag or argument, a name or -prefix the library rejects, a
missing -dsn: found before connecting); 3 reconcile found drift or something that needs a human
(with -apply: only what it left unrepaired).

stockctl prints the addresses of -redis, -sentinel and -dsn with their passwords hidden.

Examples:
  stockctl load sneaker-42 100
  stockctl -json levels sneaker-42 hoodie-7
  stockctl ledger sneaker-42 -state reserved -limit 20
  stockctl -dsn 'postgres://app@db:5432/shop' reconcile       # report only; exit 3 on drift
  stockctl -dsn sqlite:/var/lib/shop.db reconcile -apply sneaker-42  # exit 0 once all repaired
  stockctl -dsn sqlite:/var/lib/shop.db load sneaker-42 100   # Redis-only item: add its store side
  stockctl delist sneaker-42
`)
}

func printCommand(w io.Writer, c *command) {
	fmt.Fprintf(w, "usage: %s\n\n%s\n", c.usage(), strings.TrimSpace(c.long))
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	c.setup(fs)
	var n int
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		fmt.Fprint(w, "\nFlags:\n")
		fs.SetOutput(w)
		fs.PrintDefaults()
	}
	if c.example != "" {
		fmt.Fprintf(w, "\nExample:\n")
		for _, l := range strings.Split(strings.TrimSpace(c.example), "\n") {
			fmt.Fprintf(w, "  %s\n", l)
		}
	}
	fmt.Fprint(w, "\nGlobal flags (-redis, -sentinel, -prefix, -dsn, -table-prefix, -json, -timeout): see 'stockctl help'.\n")
}

// commandNames lists the commands, for tests.
func commandNames() []string {
	var names []string
	for _, c := range commands {
		names = append(names, c.name)
	}
	return names
}
