package stock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"

	"github.com/stockres/stock"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// The quickstart: preheat an item, take stock for two orders, replay one, sell out.
func Example() {
	mr := miniredis.NewMiniRedis() // in production: your Redis, standalone or Cluster
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{mr.Addr()}, DisableCache: true})
	if err != nil {
		panic(err)
	}
	defer client.Close()

	ctx := context.Background()
	r, err := stock.New(client, stock.WithUserLimit(1))
	if err != nil {
		panic(err)
	}
	if err := r.Load(ctx, "sneaker-42", 2); err != nil {
		panic(err)
	}
	for _, req := range []stock.Request{
		{SKU: "sneaker-42", ID: "order-1", User: "alice", Qty: 1},
		{SKU: "sneaker-42", ID: "order-1", User: "alice", Qty: 1}, // a retry: replayed
		{SKU: "sneaker-42", ID: "order-2", User: "alice", Qty: 1}, // one per user
		{SKU: "sneaker-42", ID: "order-3", User: "bob", Qty: 1},
		{SKU: "sneaker-42", ID: "order-4", User: "carol", Qty: 1},
	} {
		rc, err := r.Deduct(ctx, req)
		switch {
		case errors.Is(err, stock.ErrSoldOut):
			fmt.Println(req.ID, "sold out")
		case errors.Is(err, stock.ErrUserLimit):
			fmt.Println(req.ID, "over the per-user limit")
		case err != nil:
			fmt.Println(req.ID, "error:", err) // unknown outcome: retry with the same id
		default:
			fmt.Printf("%s took %d, %d left, replayed=%v\n", req.ID, rc.Qty, rc.Remaining, rc.Replayed)
		}
	}
	// Output:
	// order-1 took 1, 1 left, replayed=false
	// order-1 took 1, 1 left, replayed=true
	// order-2 over the per-user limit
	// order-3 took 1, 0 left, replayed=false
	// order-4 sold out
}

// Restore gives back what an id took, once; a restore that arrives before its deduct wins.
func ExampleReserver_Restore() {
	r, _, stop := exampleReserver()
	defer stop()
	ctx := context.Background()
	_ = r.Load(ctx, "ticket", 10)

	_, _ = r.Deduct(ctx, stock.Request{SKU: "ticket", ID: "o1", Qty: 3})
	rc, _ := r.Restore(ctx, "ticket", "o1")
	fmt.Println("restored", rc.Qty, "now", rc.Remaining)
	rc, _ = r.Restore(ctx, "ticket", "o1")
	fmt.Println("again: replayed", rc.Replayed)

	_, err := r.Restore(ctx, "ticket", "o2") // the cancel overtook its order
	fmt.Println(err)
	_, err = r.Deduct(ctx, stock.Request{SKU: "ticket", ID: "o2", Qty: 1})
	fmt.Println(err)
	// Output:
	// restored 3 now 10
	// again: replayed true
	// stock: unknown request id
	// stock: request id already restored
}

// Run delivers every sale to the database of record (here an in-memory Store), checks Redis
// against it and releases due holds, in the background: one goroutine serves a service.
func ExampleReserver_Run() {
	r, _, stop := exampleReserver()
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	db := memstore.New() // in production: a Store on your PostgreSQL or MySQL database
	_ = db.Load(ctx, "ticket", 10)
	_ = r.Load(ctx, "ticket", 10)
	done := make(chan error)
	go func() { done <- r.Run(ctx, stock.RunOptions{Store: db}) }()

	for i := range 4 {
		_, _ = r.Deduct(ctx, stock.Request{SKU: "ticket", ID: fmt.Sprint("o", i), Qty: 1})
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if left, _ := db.Remaining(ctx, "ticket"); left == 6 {
			break
		}
	}
	left, _ := db.Remaining(ctx, "ticket")
	fmt.Println("database has", left)
	cancel()
	fmt.Println(<-done) // ctx's error, once the relay delivered what was due
	// Output:
	// database has 6
	// context canceled
}

// exampleReserver starts a miniredis and returns a Reserver on it, the server, and a function
// that stops both. In production: your Redis, and a client with client-side caching (rueidis's
// default).
func exampleReserver(opts ...stock.Option) (*stock.Reserver, *miniredis.Miniredis, func()) {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{mr.Addr()}, DisableCache: true})
	if err != nil {
		panic(err)
	}
	r, err := stock.New(client, opts...)
	if err != nil {
		panic(err)
	}
	return r, mr, func() { client.Close(); mr.Close() }
}

// A checkout holds stock while the buyer pays, then confirms it; a hold that is not confirmed
// in time gives its stock back.
func ExampleReserver_Hold() {
	r, _, stop := exampleReserver()
	defer stop()
	ctx := context.Background()
	_ = r.Load(ctx, "ticket", 2)

	rc, _ := r.Hold(ctx, stock.Request{SKU: "ticket", ID: "checkout-1", Qty: 1}, 10*time.Minute)
	fmt.Println("held", rc.Qty, "left", rc.Remaining)
	l, _ := r.Levels(ctx, "ticket")
	fmt.Printf("available %d, held %d, sold %d\n", l.Available, l.Held, l.Sold)

	_, _ = r.Confirm(ctx, "ticket", "checkout-1") // the payment went through
	l, _ = r.Levels(ctx, "ticket")
	fmt.Printf("available %d, held %d, sold %d\n", l.Available, l.Held, l.Sold)

	_, err := r.Cancel(ctx, "ticket", "checkout-1") // too late: it is sold
	fmt.Println(err)
	// Output:
	// held 1 left 1
	// available 1, held 1, sold 0
	// available 1, held 0, sold 1
	// stock: hold already confirmed
}

// A cart takes every line or none; lines of one item are summed before the check.
func ExampleReserver_DeductMany() {
	r, _, stop := exampleReserver()
	defer stop()
	ctx := context.Background()
	_ = r.Load(ctx, "shirt", 5)
	_ = r.Load(ctx, "cap", 1)

	_, err := r.DeductMany(ctx, stock.Cart{ID: "cart-1", Lines: []stock.Line{
		{SKU: "shirt", Qty: 2}, {SKU: "cap", Qty: 1}, {SKU: "cap", Qty: 1},
	}})
	var ce *stock.CartError
	if errors.As(err, &ce) {
		fmt.Println("refused by", ce.SKU+":", errors.Is(err, stock.ErrInsufficient))
	}
	lv, _ := r.Levels(ctx, "shirt")
	fmt.Println("shirts left", lv.Available) // nothing of the cart was kept

	cr, _ := r.DeductMany(ctx, stock.Cart{ID: "cart-2", Lines: []stock.Line{{SKU: "shirt", Qty: 2}, {SKU: "cap", Qty: 1}}})
	for _, it := range cr.Items {
		fmt.Println(it.SKU, it.Qty, "left", it.Remaining)
	}
	// Output:
	// refused by cap: true
	// shirts left 5
	// cap 1 left 0
	// shirt 2 left 3
}

// The sold-out fast path is on by default: once Redis has answered "sold out" for an item, new
// requests for it are refused in-process until Redis says the item changed. It needs a client
// with client-side caching; on miniredis (DisableCache) every request goes to Redis.
func ExampleWithSoldOutCache() {
	r, _, stop := exampleReserver(stock.WithSoldOutCache(time.Second)) // 0 turns it off
	defer stop()
	ctx := context.Background()
	_ = r.Load(ctx, "sneaker", 1)
	_, _ = r.Deduct(ctx, stock.Request{SKU: "sneaker", ID: "o1", Qty: 1})
	for _, id := range []string{"o2", "o3", "o1"} {
		rc, err := r.Deduct(ctx, stock.Request{SKU: "sneaker", ID: id, Qty: 1})
		fmt.Println(id, err, rc.Replayed) // o1 is a replay, never "sold out"
	}
	fmt.Println("answered in-process:", stockops.SoldOutAnswers(r))
	// Output:
	// o2 stock: sold out false
	// o3 stock: sold out false
	// o1 <nil> true
	// answered in-process: 0
}
