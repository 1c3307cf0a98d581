package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/stockres/stock/internal/redisaddr"
)

// failoverRun is the SENTINEL FAILOVER that -failover-at asks for in the middle of the sale.
type failoverRun struct {
	client rueidis.Client // the buyers' Sentinel client, which must follow the new primary

	mu                        sync.Mutex
	asked, switched, followed time.Time // SENTINEL FAILOVER; the sentinels announced another primary; the client uses it
	old, primary              string    // the primary before and after
	afterBuyers               int64     // buyers who had come when it was asked for
	first                     time.Time // the answer of the first call that succeeded and started after followed
	err                       error
}

// succeeded records a call that succeeded and started at start.
func (f *failoverRun) succeeded(start time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.followed.IsZero() && start.After(f.followed) && f.first.IsZero() {
		f.first = time.Now()
	}
}

// sentinelDo sends one command to the first sentinel that answers.
func sentinelDo(ctx context.Context, addrs []string, args ...string) (rueidis.RedisResult, error) {
	var last error
	for _, a := range addrs {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{a}, ForceSingleClient: true, DisableCache: true})
		if err != nil {
			last = err
			continue
		}
		res := c.Do(ctx, c.B().Arbitrary(args...).Build())
		c.Close()
		if err := res.NonRedisError(); err != nil {
			last = err
			continue
		}
		return res, nil
	}
	return rueidis.RedisResult{}, fmt.Errorf("no sentinel answered %s: %v", strings.Join(args, " "), last)
}

// primaryAddr asks the sentinels for the primary's address.
func primaryAddr(ctx context.Context, addrs []string, name string) (string, error) {
	res, err := sentinelDo(ctx, addrs, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", name)
	if err != nil {
		return "", err
	}
	hp, err := res.AsStrSlice()
	if err != nil || len(hp) != 2 {
		return "", fmt.Errorf("SENTINEL GET-MASTER-ADDR-BY-NAME %s: %v %v", name, hp, err)
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}

// run asks the sentinels for a failover and waits until they announce another primary and the
// buyers' client uses it.
func (f *failoverRun) run(ctx context.Context, sentinel string, buyers int64) {
	err := func() error {
		opt, err := redisaddr.ParseSentinel(sentinel)
		if err != nil {
			return err
		}
		name, addrs := opt.Sentinel.MasterSet, opt.InitAddress
		f.mu.Lock()
		f.asked, f.afterBuyers = time.Now(), buyers
		f.mu.Unlock()
		old, err := primaryAddr(ctx, addrs, name)
		if err != nil {
			return err
		}
		f.mu.Lock()
		f.old = old
		f.mu.Unlock()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			res, err := sentinelDo(ctx, addrs, "SENTINEL", "FAILOVER", name)
			if err == nil {
				err = res.Error()
			}
			if err == nil {
				break
			}
			// -NOGOODSLAVE while the sentinels have not seen a replica they trust yet,
			// -INPROG while a failover is under way.
			if time.Now().After(deadline) || !(strings.Contains(err.Error(), "NOGOODSLAVE") || strings.Contains(err.Error(), "INPROG")) {
				return fmt.Errorf("SENTINEL FAILOVER %s: %w", name, err)
			}
		}
		var primary string
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if primary, err = primaryAddr(ctx, addrs, name); err == nil && primary != old {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the sentinels still announce %s 30s after SENTINEL FAILOVER", old)
			}
		}
		f.mu.Lock()
		f.switched, f.primary = time.Now(), primary
		f.mu.Unlock()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
			if _, ok := f.client.Nodes()[primary]; ok {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the Sentinel client did not switch to %s within 30s", primary)
			}
		}
		f.mu.Lock()
		f.followed = time.Now()
		f.mu.Unlock()
		return nil
	}()
	f.mu.Lock()
	f.err = err
	f.mu.Unlock()
}

// summary is the report's line on the failover.
func (f *failoverRun) summary(start time.Time) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.asked.IsZero() && f.err == nil:
		return "failover: not asked for (the buyers were done before -failover-at)"
	case f.err != nil:
		return "failover: " + f.err.Error()
	}
	first := "no call that started after the switch succeeded"
	if !f.first.IsZero() {
		first = fmt.Sprintf("the first call that started after it succeeded %v later (%v after SENTINEL FAILOVER)",
			f.first.Sub(f.followed).Round(time.Millisecond), f.first.Sub(f.asked).Round(time.Millisecond))
	}
	return fmt.Sprintf("failover: SENTINEL FAILOVER at %.1fs (%d buyers had come): the sentinels announced %s instead of %s %v later, "+
		"the buyers' client switched %v after that, %s",
		f.asked.Sub(start).Seconds(), f.afterBuyers, f.primary, f.old, f.switched.Sub(f.asked).Round(time.Millisecond),
		f.followed.Sub(f.switched).Round(time.Millisecond), first)
}
