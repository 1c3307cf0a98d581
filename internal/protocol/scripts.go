package protocol

import (
	"crypto/sha1"
	"encoding/hex"

	"github.com/redis/rueidis"
	"github.com/stockres/stock/lua"
)

// Script is one script of lua/: the definitions of lua/lib.lua its body uses followed by the
// file's body, all constants of the module, never built from input. Source and SHA1 serve the
// calls that must pipeline a script with another command on one connection (EVALSHA, then EVAL
// on NOSCRIPT).
type Script struct {
	*rueidis.Lua
	Name, Source, SHA1 string
}

// scripts is every script, for the tests.
var scripts []*Script

func newScript(name string, retryable bool) *Script {
	src, err := withLib(lua.Source("lib.lua"), lua.Source(name))
	if err != nil {
		panic("stock/internal/protocol: " + name + ": " + err.Error())
	}
	s := &Script{Name: name, Source: src}
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
)
