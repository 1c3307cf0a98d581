// Command quickstart runs a small flash sale on an embedded Redis (miniredis) and an in-memory
// database of record: 1000 buyers race for 100 units, some retry, some cancel; a relay drains
// the outbox; the program checks that nothing was oversold or applied twice.
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"

	"github.com/redis/rueidis"

	"github.com/stockres/stock"
	"github.com/stockres/stock/examples/internal/embedredis"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run() error {
	// An embedded miniredis that tells its maxmemory-policy (noeviction, as it never evicts), so
	// that the library's check that Redis cannot evict its keys passes without a warning.
	mr, err := embedredis.Start()
	if err != nil {
		return err
	}
	defer mr.Close()
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{mr.Addr()}, DisableCache: true})
	if err != nil {
		return err
	}
	defer client.Close()

	ctx := context.Background()
	const units, buyers = 100, 1000
	r, err := stock.New(client, stock.WithUserLimit(2))
	if err != nil {
		return err
	}
	db := memstore.New()
	if err := db.Load(ctx, "drop", units); err != nil {
		return err
	}
	if err := r.Load(ctx, "drop", units); err != nil {
		return err
	}

	var sold, soldOut, limited, replays, cancelled atomic.Int64
	var wg sync.WaitGroup
	for b := range buyers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(b), 1))
			req := stock.Request{SKU: "drop", ID: fmt.Sprintf("order-%d", b), User: fmt.Sprintf("user-%d", b%400), Qty: 1}
			for range 1 + rng.IntN(2) { // some buyers press the button twice
				rc, err := r.Deduct(ctx, req)
				switch {
				case err == nil && rc.Replayed:
					replays.Add(1)
				case err == nil:
					sold.Add(1)
				case errors.Is(err, stock.ErrSoldOut), errors.Is(err, stock.ErrInsufficient):
					soldOut.Add(1)
				case errors.Is(err, stock.ErrUserLimit):
					limited.Add(1)
				default:
					fmt.Fprintln(os.Stderr, "deduct:", err)
				}
			}
			if rng.IntN(10) == 0 { // one in ten changes their mind
				if rc, err := r.Restore(ctx, req.SKU, req.ID); err == nil && !rc.Replayed {
					cancelled.Add(1)
				}
			}
		})
	}
	wg.Wait()

	relay, err := stockops.NewRelay(r, db, nil, nil)
	if err != nil {
		return err
	}
	for {
		st, err := relay.Once(ctx)
		if err != nil {
			return err
		}
		if st.Claimed == 0 {
			break
		}
	}

	lv, err := r.Levels(ctx, "drop")
	if err != nil {
		return err
	}
	left, err := db.Remaining(ctx, "drop")
	if err != nil {
		return err
	}
	fmt.Printf("buyers %d  sold %d  cancelled %d  sold-out answers %d  over-limit %d  replays %d\n",
		buyers, sold.Load(), cancelled.Load(), soldOut.Load(), limited.Load(), replays.Load())
	fmt.Printf("redis: available %d sold %d loaded %d   database: remaining %d\n", lv.Available, lv.Sold, lv.Loaded, left)

	ok := lv.Available >= 0 && lv.Loaded == lv.Available+lv.Held+lv.Sold &&
		lv.Sold == sold.Load()-cancelled.Load() && left == lv.Available && db.MaxApplications() <= 1
	if !ok {
		return errors.New("FAIL: an invariant does not hold")
	}
	fmt.Println("PASS: no oversell, no double apply, Redis and the database agree")
	return nil
}
