package stock_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"

	"github.com/stockres/stock"
	"github.com/stockres/stock/memstore"
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
	mr := miniredis.NewMiniRedis()
	_ = mr.Start()
	defer mr.Close()
	client, _ := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{mr.Addr()}, DisableCache: true})
	defer client.Close()
	ctx := context.Background()
	r, _ := stock.New(client)
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

// A Relay drains the outbox into the database of record; here an in-memory Store.
func ExampleRelay() {
	mr := miniredis.NewMiniRedis()
	_ = mr.Start()
	defer mr.Close()
	client, _ := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{mr.Addr()}, DisableCache: true})
	defer client.Close()
	ctx := context.Background()
	r, _ := stock.New(client)
	db := memstore.New() // in production: sqlstore on PostgreSQL or MySQL
	_ = db.Load(ctx, "ticket", 10)
	_ = r.Load(ctx, "ticket", 10)

	for i := range 4 {
		_, _ = r.Deduct(ctx, stock.Request{SKU: "ticket", ID: fmt.Sprint("o", i), Qty: 1})
	}
	relay, _ := r.NewRelay(db, nil)
	st, _ := relay.Once(ctx) // or go relay.Run(ctx)
	left, _ := db.Remaining(ctx, "ticket")
	fmt.Println("delivered", st.Delivered, "database has", left)
	// Output:
	// delivered 4 database has 6
}
