package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// Keys records in Redis which purchase each (user, Idempotency-Key) names: the sku and the
// quantity it was first used with. Every instance of the service shares the records, and they
// outlive a restart, so a key reused for another purchase is refused (422) whichever instance
// sees it and however long after. (The stock library's ledger cannot do this alone: its
// request ids are scoped per item, so the same id on another item is another request to it.)
//
// A record is one Redis hash, "<prefix>|key:<len(user)>:<user>:<key>", with two fields: p, the
// purchase ("<qty>|<sku>"), and n, the attempts that used it and did not end refused. It
// expires ttl after the key's first use, and is not extended by retries: that is the key's
// lifetime. Record keys never meet the stock library's, whatever the Reserver's prefix: the
// library's are "<p>:" followed by '{' or one of its names (items, epoch, due{~n}, ...), with
// p a prefix, which holds no '|'. For "<prefix>|key:..." to start with "<p>:", p must be the
// part of prefix before one of its ':', and what follows it, the rest of prefix and "|key:",
// is then neither a brace nor a name of the library's. The user's length comes first, so no
// two (user, key) pairs give the same record key.
//
// A record is deleted early only when every attempt that used it was refused without taking
// stock (sold out, insufficient, over the user limit, no such item, closed): such a key is
// free again, for any purchase (though for the same purchase the library's ledger still has
// its say: a refusal it recorded for a retry stays the answer). An attempt that took stock, or
// may have (an unknown outcome, a crash), never gives its use back: the key stays bound to its
// purchase until the record expires.
type Keys struct {
	c      rueidis.Client
	prefix string
	ttl    time.Duration
}

// NewKeys returns the key records on c, under prefix (a valid name: no braces, '|', spaces or
// control characters; main passes the Reserver's prefix), each kept for ttl after the key's
// first use (at least a millisecond).
func NewKeys(c rueidis.Client, prefix string, ttl time.Duration) (*Keys, error) {
	if e := checkName("prefix", prefix); e != nil {
		return nil, errors.New(e.msg)
	}
	if ttl < time.Millisecond {
		return nil, fmt.Errorf("key lifetime %v: want at least 1ms", ttl)
	}
	return &Keys{c: c, prefix: prefix, ttl: ttl}, nil
}

// TTL returns how long a key stays bound to its purchase after its first use.
func (k *Keys) TTL() time.Duration { return k.ttl }

// record returns the Redis key of the record of (user, key).
func (k *Keys) record(user, key string) string {
	return k.prefix + "|key:" + strconv.Itoa(len(user)) + ":" + user + ":" + key
}

// purchase is what a key is bound to. A sku holds no '|'.
func purchase(sku string, qty int64) string {
	return strconv.FormatInt(qty, 10) + "|" + sku
}

// useScript binds the record KEYS[1] to the purchase ARGV[1] for ARGV[2] ms if it is free,
// and counts one more use of it. It answers 0 when the key was free (the first use), 1 when
// it was bound to this purchase already (an earlier attempt may have taken stock), and the
// other purchase when it was bound to another one (nothing is changed).
var useScript = rueidis.NewLuaScript(`
local p = redis.call('HGET', KEYS[1], 'p')
if not p then
  redis.call('HSET', KEYS[1], 'p', ARGV[1], 'n', 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 0
end
if p ~= ARGV[1] then
  return p
end
redis.call('HINCRBY', KEYS[1], 'n', 1)
return 1
`)

// refusedScript gives back one use of the record KEYS[1] of purchase ARGV[1], whose attempt
// was refused without taking stock, and deletes the record once no use is left.
var refusedScript = rueidis.NewLuaScript(`
if redis.call('HGET', KEYS[1], 'p') ~= ARGV[1] then
  return 0
end
if redis.call('HINCRBY', KEYS[1], 'n', -1) <= 0 then
  redis.call('DEL', KEYS[1])
end
return 1
`)

// errKeyReused: the key is bound to another purchase.
var errKeyReused = errors.New("checkout: Idempotency-Key used for another purchase")

// Use counts an attempt of user's key for qty units of sku. It returns again = true when the
// key was used for this purchase before (an earlier attempt may have run: the hold is then
// marked stock.Request.Retry), errKeyReused when it is bound to another purchase, and any
// other error when Redis did not answer (the use may or may not have been counted; counting
// it twice only keeps the record longer).
func (k *Keys) Use(ctx context.Context, user, key, sku string, qty int64) (again bool, err error) {
	want := purchase(sku, qty)
	res := useScript.Exec(ctx, k.c, []string{k.record(user, key)},
		[]string{want, strconv.FormatInt(k.ttl.Milliseconds(), 10)})
	m, err := res.ToMessage()
	if err != nil {
		return false, err
	}
	if m.IsInt64() {
		n, _ := m.AsInt64()
		return n == 1, nil
	}
	if p, err := m.ToString(); err != nil {
		return false, fmt.Errorf("checkout: unexpected reply to a key record: %w", err)
	} else if p != want {
		return false, errKeyReused
	}
	return true, nil // not answered by the script (it answers 1), but the purchase is this one
}

// Refused gives back the use of an attempt that was refused without taking stock. It is not
// retried: a use not given back only keeps the key bound until its record expires, while a
// use given back twice could free a key that another attempt is using.
func (k *Keys) Refused(ctx context.Context, user, key, sku string, qty int64) error {
	return refusedScript.Exec(ctx, k.c, []string{k.record(user, key)}, []string{purchase(sku, qty)}).Error()
}
