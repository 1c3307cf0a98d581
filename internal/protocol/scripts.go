package protocol

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/rueidis"
	"github.com/stockres/stock/lua"
)

// Script is one script of lua/: the definitions of lua/lib.lua its body uses followed by the
// file's body, all constants of the module, never built from input. Source and SHA1 serve the
// calls that must pipeline a script with another command on one connection (EVALSHA, then EVAL
// on NOSCRIPT). Func is the name of the same body in the function library (see Library), which
// Exec calls with FCALL when the client allows it.
type Script struct {
	*rueidis.Lua
	Name, Source, SHA1, Func string
	body                     string
	retryable                bool // rueidis may resend a call after a broken connection
}

// scripts is every script, for the tests and the library.
var scripts []*Script

func newScript(name string, retryable bool) *Script {
	body := lua.Source(name)
	src, err := withLib(lua.Source("lib.lua"), body)
	if err != nil {
		panic("stock/internal/protocol: " + name + ": " + err.Error())
	}
	s := &Script{Name: name, Source: src, body: body, retryable: retryable}
	scripts = append(scripts, s)
	sum := sha1.Sum([]byte(src))
	s.SHA1 = hex.EncodeToString(sum[:])
	if retryable {
		s.Lua = rueidis.NewLuaScriptRetryable(src)
	} else {
		s.Lua = rueidis.NewLuaScript(src)
	}
	return s
}

// The scripts. Those idempotent in their request id are retryable: rueidis may resend them
// after a broken connection.
var (
	Deduct     = newScript("deduct.lua", true)
	DeductMany = newScript("deductmany.lua", true)
	Restore    = newScript("restore.lua", true)
	Load       = newScript("load.lua", false)
	Close      = newScript("close.lua", true)
	Delist     = newScript("delist.lua", true)
	Restock    = newScript("restock.lua", true)
	Confirm    = newScript("confirm.lua", true)
	Extend     = newScript("extend.lua", true)
	Sweep      = newScript("sweep.lua", true)
	Snapshot   = newScript("snapshot.lua", true)
	Adjust     = newScript("adjust.lua", false)
	Rebuild    = newScript("rebuild.lua", true)
	Requeue    = newScript("requeue.lua", true)
	Rerecord   = newScript("rerecord.lua", true)
	Trim       = newScript("trim.lua", true)
	Retire     = newScript("retire.lua", true)
	Unlock     = newScript("unlock.lua", true)
	Refresh    = newScript("refresh.lua", true)
	Claim      = newScript("claim.lua", false)
	Ack        = newScript("ack.lua", true)
	DeadLetter = newScript("deadletter.lua", true)
	Turn       = newScript("turn.lua", true)
	Cart       = newScript("cart.lua", true)
	XOut       = newScript("xout.lua", true)
	XIn        = newScript("xin.lua", true)
	XDone      = newScript("xdone.lua", true)
	Route      = newScript("route.lua", true)
)

// Library is the source of the Redis function library (FUNCTION LOAD, Redis 7 and later) of
// every script, and LibraryName its name. The library defines lib.lua's helpers once, when it
// is loaded, and registers each script's body, unchanged, as the function Script.Func taking
// KEYS and ARGV: an FCALL does not define the helpers anew as a script call does. The name ends
// with a digest of the source, so that versions of this package that differ in a script never
// share or replace each other's library (each registers its own; an old one is left to the
// operator, FUNCTION DELETE, and costs nothing but its memory).
var Library, LibraryName string

// init builds the library once every script is built (package variables are initialized first).
func init() { Library, LibraryName = library() }

func library() (src, name string) {
	var b strings.Builder
	b.WriteString(lua.Source("lib.lua"))
	for _, s := range scripts {
		b.WriteString("\nredis.register_function('@FUNC@" + strings.TrimSuffix(s.Name, ".lua") + "', function(KEYS, ARGV)\n")
		b.WriteString(s.body)
		b.WriteString("\nend)\n")
	}
	code := b.String()
	sum := sha1.Sum([]byte(code))
	name = "stock_" + hex.EncodeToString(sum[:8])
	for _, s := range scripts {
		s.Func = name + "_" + strings.TrimSuffix(s.Name, ".lua")
	}
	return "#!lua name=" + name + "\n" + strings.ReplaceAll(code, "@FUNC@", name+"_"), name
}

// Functions is whether a client's server runs the scripts as functions. A client that carries
// one (FunctionsHolder) calls the scripts with FCALL, loading the library on the first "Function
// not found", until the server shows it has no functions or the user may not use them (unknown
// command, NOPERM), or the library cannot be loaded because another library defines one of its
// function names: from then on that client's calls are EVALSHA, as a client without one's are.
type Functions struct {
	off atomic.Bool
}

// NewFunctions returns the state of a client that tries functions first.
func NewFunctions() *Functions { return &Functions{} }

// FunctionsHolder is a client that carries its Functions.
type FunctionsHolder interface {
	StockFunctions() *Functions
}

// Exec runs the script on c: with FCALL when c carries Functions that are not off, else (and
// whenever FCALL is refused before the function ran) with EVALSHA, then EVAL on NOSCRIPT.
func (s *Script) Exec(ctx context.Context, c rueidis.Client, keys, args []string) rueidis.RedisResult {
	h, ok := c.(FunctionsHolder)
	if !ok {
		return s.Lua.Exec(ctx, c, keys, args)
	}
	f := h.StockFunctions()
	if f == nil || f.off.Load() {
		return s.Lua.Exec(ctx, c, keys, args)
	}
	for try := 0; ; try++ {
		cmd := c.B().Fcall().Function(s.Func).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
		if s.retryable {
			cmd = cmd.ToRetryable()
		}
		res := c.Do(ctx, cmd)
		switch refusedFcall(res.Error()) {
		case fcallRan:
			return res
		case fcallNotFound:
			if try == 0 && loadLibrary(ctx, c, f) {
				continue
			}
		case fcallUnsupported:
			f.off.Store(true)
		}
		// Refused before the function ran: nothing was written, the script gives the answer.
		return s.Lua.Exec(ctx, c, keys, args)
	}
}

const (
	fcallRan         = iota // the function ran (or the outcome is unknown): its reply stands
	fcallNotFound           // the library is not on the server (new, flushed, or a new node)
	fcallUnsupported        // no functions on this server, or not for this user
	fcallRefused            // refused before running for now (OOM): run the script instead
)

// refusedFcall classifies the error of an FCALL. Only errors Redis gives before the function
// runs count as refusals: an error of the function itself (a script error, which may come after
// a write), or of the connection, is its answer. An unknown command or a missing permission
// counts only when it names FCALL itself, not a command the function ran.
func refusedFcall(err error) int {
	re, ok := rueidis.IsRedisErr(err)
	if !ok {
		return fcallRan
	}
	msg := re.Error()
	lower := strings.ToLower(msg)
	switch {
	case strings.HasPrefix(msg, "ERR Function not found") || msg == "Function not found":
		return fcallNotFound
	case strings.HasPrefix(msg, "NOPERM") && strings.Contains(lower, "'fcall'"),
		strings.Contains(lower, "unknown command") && (strings.Contains(lower, "'fcall'") || strings.Contains(lower, "`fcall`")):
		return fcallUnsupported
	case strings.HasPrefix(msg, "OOM "):
		// A function without the allow-oom flag is refused on an out-of-memory server before
		// it runs (or at its first write, before any), where a script runs and is refused at
		// its first write (replays and refusals still answer): the script keeps that behaviour.
		return fcallRefused
	}
	return fcallRan
}

// loadLibrary loads the library on every node of c at once (a replica refuses, and receives it
// from its primary; a node that has it already says so), so that the load takes one command's
// time, not one per node, and reports whether a node took it or had it. A refusal that says the
// server has no functions, or that the user may not load them, or that another library holds one
// of its function names, turns f off.
func loadLibrary(ctx context.Context, c rueidis.Client, f *Functions) bool {
	var loaded atomic.Bool
	var wg sync.WaitGroup
	for _, n := range c.Nodes() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := n.Do(ctx, n.B().FunctionLoad().FunctionCode(Library).Build()).Error()
			re, isRedis := rueidis.IsRedisErr(err)
			switch {
			case err == nil:
				loaded.Store(true)
			case isRedis && strings.Contains(re.Error(), "Library") && strings.Contains(re.Error(), "already exists"):
				loaded.Store(true) // ours: another process loaded it first
			case isRedis && strings.Contains(re.Error(), "already exists"):
				// "Function <name> already exists": another library defines a function of ours,
				// so ours cannot be loaded, and FCALL of that name would run the other one.
				f.off.Store(true)
			case isRedis && (strings.HasPrefix(re.Error(), "NOPERM") || strings.Contains(strings.ToLower(re.Error()), "unknown command")):
				f.off.Store(true) // FUNCTION LOAD, the only command here, is what is refused
			}
		}()
	}
	wg.Wait()
	return loaded.Load()
}
