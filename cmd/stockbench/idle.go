package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/stockres/stock"
)

// idlePoll is the relay's poll interval in the idle report (RelayOptions.Poll's default).
const idlePoll = 100 * time.Millisecond

// IdleResult is one row of the idle report: the cost of Run's background loops with no
// traffic over a catalogue of Items items, and how soon a new event reached the publisher.
type IdleResult struct {
	Items        int     `json:"items"`        // 0: no Run (the server's own idle cost)
	RedisCore    float64 `json:"redis_core"`   // share of one core the Redis servers used
	CommandsPerS float64 `json:"commands_s"`   // commands the servers ran per second
	ScriptsPerS  float64 `json:"scripts_s"`    // script calls per second
	DeliveryMax  string  `json:"delivery_max"` // the slowest of five new events, deduct to publisher
	DeliveryPoll float64 `json:"delivery_polls"`
}

// idleReport measures, for each catalogue size, Run (a relay into a publisher, the sweeper and
// cart recovery, with their defaults) over that many items and no traffic: Redis CPU and calls
// over cfg.duration, then five deducts on random items and how long each took to reach the
// publisher. A first row measures the servers with no Run at all.
func (b *bench) idleReport(ctx context.Context, w io.Writer) ([]IdleResult, error) {
	var out []IdleResult
	base, err := b.idleMeasure(ctx, b.cfg.duration)
	if err != nil {
		return nil, err
	}
	out = append(out, base)
	for _, n := range b.cfg.idle {
		res, err := b.idleOne(ctx, n)
		b.cleanupAll()
		if err != nil {
			return out, err
		}
		out = append(out, res)
	}
	if b.cfg.json {
		return out, nil
	}
	fmt.Fprintf(w, "Idle background work (%s, Run with a publisher: relay poll %v, sweep every 1s; %v per row)\n\n", b.target, idlePoll, b.cfg.duration)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "items\tRedis CPU (% of a core)\tcommands/s\tscript calls/s\tnew event delivered (max of 5)\tin poll intervals")
	for _, r := range out {
		items, del, polls := strconv.Itoa(r.Items), r.DeliveryMax, fmt.Sprintf("%.1f", r.DeliveryPoll)
		if r.Items == 0 {
			items, del, polls = "no Run", "—", "—"
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%.0f\t%.0f\t%s\t%s\n", items, 100*r.RedisCore, r.CommandsPerS, r.ScriptsPerS, del, polls)
	}
	return out, tw.Flush()
}

// idleMeasure returns the servers' CPU share and call rates over d.
func (b *bench) idleMeasure(ctx context.Context, d time.Duration) (IdleResult, error) {
	s0, err := b.sample(ctx)
	if err != nil {
		return IdleResult{}, err
	}
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return IdleResult{}, ctx.Err()
	case <-time.After(d):
	}
	secs := time.Since(t0).Seconds()
	s1, err := b.sample(ctx)
	if err != nil {
		return IdleResult{}, err
	}
	return IdleResult{RedisCore: (s1.cpu - s0.cpu) / secs, CommandsPerS: (s1.all - s0.all) / secs, ScriptsPerS: (s1.scripts - s0.scripts) / secs}, nil
}

func (b *bench) idleOne(ctx context.Context, n int) (IdleResult, error) {
	r, err := stock.New(b.client, stock.WithPrefix(b.prefix("idle"+strconv.Itoa(n))))
	if err != nil {
		return IdleResult{}, err
	}
	skus := make([]string, n)
	for i := range skus {
		skus[i] = "item-" + strconv.Itoa(i)
	}
	if err := loadAll(ctx, r, skus); err != nil {
		return IdleResult{}, err
	}
	var mu sync.Mutex
	got := map[string]chan struct{}{}
	pub := stock.PublisherFunc(func(_ context.Context, ev stock.Event) error {
		mu.Lock()
		if ch, ok := got[ev.ID]; ok {
			close(ch)
			delete(got, ev.ID)
		}
		mu.Unlock()
		return nil
	})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx, stock.RunOptions{Publisher: pub, Drain: -1}) }()
	defer func() { stop(); <-done }()
	// Let the loads' events be delivered and the walks start.
	time.Sleep(3 * time.Second)
	res, err := b.idleMeasure(ctx, b.cfg.duration)
	if err != nil {
		return res, err
	}
	res.Items = n
	var worst time.Duration
	var seq atomic.Int64
	for i := range 5 {
		id := "idle-" + strconv.FormatInt(seq.Add(1), 10)
		ch := make(chan struct{})
		mu.Lock()
		got[id] = ch
		mu.Unlock()
		sku := skus[(i*7919+n/2)%n]
		t0 := time.Now()
		if _, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: 1}); err != nil {
			return res, fmt.Errorf("idle: deduct: %w", err)
		}
		select {
		case <-ch:
			worst = max(worst, time.Since(t0))
		case <-time.After(time.Minute):
			return res, fmt.Errorf("idle: an event of %s not delivered in a minute", sku)
		case <-ctx.Done():
			return res, ctx.Err()
		}
		time.Sleep(time.Duration(i+1) * 37 * time.Millisecond) // at other moments of the poll
	}
	res.DeliveryMax = worst.Round(time.Millisecond).String()
	res.DeliveryPoll = float64(worst) / float64(idlePoll)
	return res, nil
}

// loadAll loads every item with 1,000 units, 64 at a time.
func loadAll(ctx context.Context, r *stock.Reserver, skus []string) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(skus) && ctx.Err() == nil; i += 64 {
				if err := r.Load(ctx, skus[i], 1000); err != nil {
					mu.Lock()
					first = cmp.Or(first, err)
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if first != nil {
		return fmt.Errorf("idle: load: %w", first)
	}
	return ctx.Err()
}
