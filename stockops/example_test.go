package stockops_test

import (
	"context"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"

	"github.com/stockres/stock"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// A Relay drains the outbox into the database of record; here an in-memory Store.
func ExampleRelay() {
	r, _, stop := exampleReserver()
	defer stop()
	ctx := context.Background()
	db := memstore.New() // in production: a Store on your PostgreSQL or MySQL database
	_ = db.Load(ctx, "ticket", 10)
	_ = r.Load(ctx, "ticket", 10)

	for i := range 4 {
		_, _ = r.Deduct(ctx, stock.Request{SKU: "ticket", ID: fmt.Sprint("o", i), Qty: 1})
	}
	relay, _ := stockops.NewRelay(r, db, nil, nil)
	st, _ := relay.Once(ctx) // or go relay.Run(ctx)
	left, _ := db.Remaining(ctx, "ticket")
	fmt.Println("delivered", st.Delivered, "database has", left)
	// Output:
	// delivered 4 database has 6
}

// A Reconciler compares Redis with the database of record and repairs what drifted, here an
// item whose keys were lost (a Redis restart without persistence).
func ExampleReconciler() {
	r, mr, stop := exampleReserver()
	defer stop()
	ctx := context.Background()
	db := memstore.New()
	_ = db.Load(ctx, "ticket", 10)
	_ = r.Load(ctx, "ticket", 10)
	_, _ = r.Deduct(ctx, stock.Request{SKU: "ticket", ID: "o1", Qty: 3})
	relay, _ := stockops.NewRelay(r, db, nil, nil)
	_, _ = relay.Once(ctx)

	mr.Del("stock:{ticket}") // the item's counters are gone
	_, err := r.Levels(ctx, "ticket")
	fmt.Println(err)

	rec, _ := stockops.NewReconciler(r, db, nil) // &stock.ReconcileOptions{DryRun: true} only reports
	reports, _ := rec.Once(ctx)                  // Reserver.Run makes a pass every 5 minutes
	fmt.Println(reports[0].Rebuilt)
	lv, _ := r.Levels(ctx, "ticket")
	fmt.Println("available", lv.Available)
	// Output:
	// stock: item not loaded: ticket
	// true
	// available 7
}

// exampleReserver starts a miniredis and returns a Reserver on it, the server, and a function
// that stops both. In production: your Redis, and a client with client-side caching (rueidis's
// default).
func exampleReserver() (*stock.Reserver, *miniredis.Miniredis, func()) {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{mr.Addr()}, DisableCache: true})
	if err != nil {
		panic(err)
	}
	r, err := stock.New(client)
	if err != nil {
		panic(err)
	}
	return r, mr, func() { client.Close(); mr.Close() }
}
