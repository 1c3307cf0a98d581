package stock

import (
	"context"
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"fmt"

	"github.com/redis/rueidis"
)

//go:embed lua/*.lua
var luaFiles embed.FS

// Scripts. Every one is lua/lib.lua followed by the file's body; both are constants of this
// package, never built from input. Scripts that are idempotent in their request id are marked
// retryable, so rueidis may resend them after a broken connection.
var (
	deductScript   = newScript("deduct.lua", true)
	restoreScript  = newScript("restore.lua", true)
	loadScript     = newScript("load.lua", false)
	closeScript    = newScript("close.lua", true)
	restockScript  = newScript("restock.lua", true)
	confirmScript  = newScript("confirm.lua", true)
	extendScript   = newScript("extend.lua", true)
	sweepScript    = newScript("sweep.lua", true)
	snapshotScript = newScript("snapshot.lua", true)
	adjustScript   = newScript("adjust.lua", false)
	rebuildScript  = newScript("rebuild.lua", true)
	requeueScript  = newScript("requeue.lua", true)
	rerecordScript = newScript("rerecord.lua", true)
	trimScript     = newScript("trim.lua", true)
	unlockScript   = newScript("unlock.lua", true)
	refreshScript  = newScript("refresh.lua", true)
	claimScript    = newScript("claim.lua", false)
	ackScript      = newScript("ack.lua", true)
	deadScript     = newScript("deadletter.lua", true)
	turnScript     = newScript("turn.lua", true)
	cartScript     = newScript("cart.lua", true)
	manyScript     = newScript("deductmany.lua", true)
	delistScript   = newScript("delist.lua", true)
	retireScript   = newScript("retire.lua", true)
)

func newScript(name string, retryable bool) *rueidis.Lua {
	lib, err := luaFiles.ReadFile("lua/lib.lua")
	if err != nil {
		panic(err)
	}
	body, err := luaFiles.ReadFile("lua/" + name)
	if err != nil {
		panic(err)
	}
	src := string(lib) + "\n" + string(body)
	var l *rueidis.Lua
	if retryable {
		l = rueidis.NewLuaScriptRetryable(src)
	} else {
		l = rueidis.NewLuaScript(src)
	}
	sum := sha1.Sum([]byte(src))
	sources[l] = scriptSource{src: src, sha: hex.EncodeToString(sum[:])}
	return l
}

// scriptSource keeps a script's text and SHA-1, for the calls that must pipeline a script with
// another command on one connection (WithReplicaAck).
type scriptSource struct{ src, sha string }

var sources = map[*rueidis.Lua]scriptSource{}

// exec runs a script. With WithReplicaAck, the script and a WAIT go on one connection, one after
// the other; ackErr then says whether enough replicas acknowledged (nil if they did).
func (r *Reserver) exec(ctx context.Context, s *rueidis.Lua, keys, args []string) (res rueidis.RedisResult, ackErr error) {
	if r.opts.replicas == 0 {
		return s.Exec(ctx, r.client, keys, args), nil
	}
	src := sources[s]
	_ = r.client.Dedicated(func(c rueidis.DedicatedClient) error {
		wait := c.B().Wait().Numreplicas(int64(r.opts.replicas)).Timeout(r.opts.replicaWait.Milliseconds()).Build()
		out := c.DoMulti(ctx, c.B().Evalsha().Sha1(src.sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build(), wait)
		if re, ok := rueidis.IsRedisErr(out[0].Error()); ok && re.IsNoScript() {
			wait = c.B().Wait().Numreplicas(int64(r.opts.replicas)).Timeout(r.opts.replicaWait.Milliseconds()).Build()
			out = c.DoMulti(ctx, c.B().Eval().Script(src.src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build(), wait)
		}
		res = out[0]
		n, err := out[1].AsInt64()
		switch {
		case err != nil:
			ackErr = fmt.Errorf("%w: WAIT: %v", ErrNotReplicated, err)
		case n < int64(r.opts.replicas):
			ackErr = fmt.Errorf("%w: %d of %d replicas within %v", ErrNotReplicated, n, r.opts.replicas, r.opts.replicaWait)
		}
		return nil
	})
	return res, ackErr
}

// outcome is one request's result as a script reports it: three integers.
type outcome struct {
	code, remaining, qty int64
}

// decodeOutcomes checks that a script answered with n triples of integers and decodes them.
// A transport or Redis error is returned as is (wrapped), so errors.As finds *rueidis.RedisError
// and ErrUnknownOutcome; a reply of another shape is ErrUnknownOutcome: the script may have run
// and written before it answered something this package does not understand.
func decodeOutcomes(res rueidis.RedisResult, dst []outcome) error {
	msgs, err := replyArray(res, 3*len(dst))
	if err != nil {
		return err
	}
	for i := range dst {
		var v [3]int64
		for j := range v {
			if v[j], err = replyInt(msgs[3*i+j]); err != nil {
				return fmt.Errorf("%w: malformed script reply, value %d: %v", ErrUnknownOutcome, 3*i+j, err)
			}
		}
		dst[i] = outcome{code: v[0], remaining: v[1], qty: v[2]}
	}
	return nil
}

// decodeOne decodes the reply of a script that answers for one request.
func decodeOne(res rueidis.RedisResult) (outcome, error) {
	var o [1]outcome
	err := decodeOutcomes(res, o[:])
	return o[0], err
}

// decodePair decodes a two-integer reply (load.lua and the like).
func decodePair(res rueidis.RedisResult) (code, value int64, err error) {
	msgs, err := replyArray(res, 2)
	if err != nil {
		return 0, 0, err
	}
	if code, err = replyInt(msgs[0]); err == nil {
		value, err = replyInt(msgs[1])
	}
	if err != nil {
		return 0, 0, fmt.Errorf("%w: malformed script reply: %v", ErrUnknownOutcome, err)
	}
	return code, value, nil
}

// replyArray returns the elements of an array reply of exactly n elements.
func replyArray(res rueidis.RedisResult, n int) ([]rueidis.RedisMessage, error) {
	if err := res.Error(); err != nil && !rueidis.IsRedisNil(err) {
		return nil, fmt.Errorf("stock: script: %w", err)
	}
	msgs, err := res.ToArray()
	if err != nil {
		return nil, fmt.Errorf("%w: malformed script reply, not an array: %v", ErrUnknownOutcome, err)
	}
	if len(msgs) != n {
		return nil, fmt.Errorf("%w: malformed script reply, %d values, want %d", ErrUnknownOutcome, len(msgs), n)
	}
	return msgs, nil
}

// replyInt reads one integer element of a script's reply (Lua numbers arrive as integers).
func replyInt(m rueidis.RedisMessage) (int64, error) {
	return m.AsInt64()
}

func isNil(err error) bool { return rueidis.IsRedisNil(err) }
