package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/rueidis"
	"github.com/stockres/stock/internal/protocol"
)

// exec runs a script. With WithReplicaAck, the script and a WAIT go on one connection, one after
// the other; ackErr then says whether enough replicas acknowledged (nil if they did).
func (r *Reserver) exec(ctx context.Context, s *protocol.Script, keys, args []string) (res rueidis.RedisResult, ackErr error) {
	if r.opts.replicas == 0 {
		return s.Exec(ctx, r.client, keys, args), nil
	}
	// WAIT waits for this connection's writes. A replay writes nothing, and its WAIT would
	// answer at once while the original write (made before, perhaps on another connection, and
	// answered ErrNotReplicated) is still on the primary alone; so every call also writes a
	// mark in the item's slot, which the replicas receive after everything written before it.
	mark := func(c rueidis.DedicatedClient) rueidis.Completed {
		return c.B().Set().Key(protocol.AckMark(keys[0])).Value("1").Px(r.opts.replicaWait + time.Second).Build()
	}
	wait := func(c rueidis.DedicatedClient) rueidis.Completed {
		return c.B().Wait().Numreplicas(int64(r.opts.replicas)).Timeout(r.opts.replicaWait.Milliseconds()).Build()
	}
	_ = r.client.Dedicated(func(c rueidis.DedicatedClient) error {
		out := c.DoMulti(ctx, c.B().Evalsha().Sha1(s.SHA1).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build(), mark(c), wait(c))
		if re, ok := rueidis.IsRedisErr(out[0].Error()); ok && re.IsNoScript() {
			out = c.DoMulti(ctx, c.B().Eval().Script(s.Source).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build(), mark(c), wait(c))
		}
		res = out[0]
		if err := out[1].Error(); err != nil {
			ackErr = fmt.Errorf("%w: the write mark before WAIT: %v", ErrNotReplicated, err)
			return nil
		}
		n, err := out[2].AsInt64()
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
