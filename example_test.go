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

// A checkout takes one unit per order and tells the buyer what happened; a cancelled order
// gives its unit back. Each outcome has its own error.
func ExampleReserver_Deduct() {
	r, _, stop := exampleReserver(stock.WithUserLimit(1))
	defer stop()
	ctx := context.Background()
	_ = r.Load(ctx, "sneaker", 2) // once, from the database of record

	checkout := func(orderID, user string) {
		rc, err := r.Deduct(ctx, stock.Request{SKU: "sneaker", ID: orderID, User: user, Qty: 1})
		switch {
		case err == nil:
			fmt.Printf("%s: yours (%d left)\n", orderID, rc.Remaining)
		case errors.Is(err, stock.ErrSoldOut), errors.Is(err, stock.ErrInsufficient):
			fmt.Printf("%s: sold out\n", orderID)
		case errors.Is(err, stock.ErrUserLimit):
			fmt.Printf("%s: one per customer\n", orderID)
		case errors.Is(err, stock.ErrRestored):
			fmt.Printf("%s: this order was cancelled\n", orderID)
		case errors.Is(err, stock.ErrInvalid), errors.Is(err, stock.ErrConflict):
			fmt.Printf("%s: bad request: %v\n", orderID, err)
		default: // ErrUnknownOutcome and the like: it may have run; retry with the same id
			fmt.Printf("%s: try again: %v\n", orderID, err)
		}
	}
	checkout("order-1", "alice")
	checkout("order-2", "alice")
	checkout("order-3", "bob")
	checkout("order-4", "carol")

	rc, _ := r.Restore(ctx, "sneaker", "order-3") // bob cancelled
	fmt.Println("order-3 gave back", rc.Qty)
	checkout("order-3", "bob") // the id cannot take stock again
	checkout("order-5", "carol")
	// Output:
	// order-1: yours (1 left)
	// order-2: one per customer
	// order-3: yours (0 left)
	// order-4: sold out
	// order-3 gave back 1
	// order-3: this order was cancelled
	// order-5: yours (0 left)
}

// After an unknown outcome (a timeout, a broken connection) the caller cannot tell whether the
// deduct ran: it retries with the same id and Retry set. A retry of a deduct that did run is a
// replay and takes nothing twice; had it not run, the retry would take the stock now.
func ExampleReserver_Deduct_retry() {
	r, _, stop := exampleReserver()
	defer stop()
	ctx := context.Background()
	_ = r.Load(ctx, "ticket", 5)

	req := stock.Request{SKU: "ticket", ID: "order-7", Qty: 2}
	_, _ = r.Deduct(ctx, req) // say this answer was lost: ErrUnknownOutcome

	req.Retry = true // a refusal of the retry is then recorded, so a late first attempt is refused too
	rc, err := r.Deduct(ctx, req)
	fmt.Println(err, rc.Qty, rc.Remaining, rc.Replayed)
	// Output:
	// <nil> 2 3 true
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
// against it and releases due holds, in the background: one goroutine serves a service. Check
// the options before starting it, and read its error: options out of range stop Run at once.
func ExampleReserver_Run() {
	r, _, stop := exampleReserver()
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db := memstore.New() // in production: a Store on your PostgreSQL or MySQL database
	_ = db.Load(ctx, "ticket", 10)
	_ = r.Load(ctx, "ticket", 10)

	opts := stock.RunOptions{Store: db}
	if err := opts.Validate(); err != nil {
		fmt.Println("not starting:", err) // in production: the service does not start
		return
	}
	done := make(chan error, 1)
	go func() {
		err := r.Run(ctx, opts)
		if err != nil && ctx.Err() == nil {
			fmt.Println("background work stopped:", err) // in production: log it, or exit
		}
		done <- err
	}()

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

// Validate says at once what Run would refuse, before the service starts its background work.
func ExampleRunOptions_Validate() {
	opts := stock.RunOptions{
		Store: memstore.New(),
		Relay: &stock.RelayOptions{Batch: 50000}, // at most 10,000
	}
	err := opts.Validate()
	fmt.Println(errors.Is(err, stock.ErrInvalid))
	fmt.Println(err)
	// Output:
	// true
	// stock: invalid input: relay batch 50000 out of range [1, 10000]
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

// A cart of holds keeps every line while the buyer pays, then is confirmed as a whole under
// the cart's id; CancelMany would give every line back.
func ExampleReserver_HoldMany() {
	r, _, stop := exampleReserver()
	defer stop()
	ctx := context.Background()
	_ = r.Load(ctx, "shirt", 5)
	_ = r.Load(ctx, "cap", 2)

	cart := stock.Cart{ID: "cart-9", User: "alice", Lines: []stock.Line{{SKU: "shirt", Qty: 2}, {SKU: "cap", Qty: 1}}}
	cr, err := r.HoldMany(ctx, cart, 10*time.Minute)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, it := range cr.Items { // in SKU order
		fmt.Println("held", it.SKU, it.Qty)
	}

	rcs, err := r.ConfirmMany(ctx, cart.ID, "shirt", "cap") // the payment went through
	fmt.Println("confirmed", len(rcs), "lines:", err)
	l, _ := r.Levels(ctx, "shirt")
	fmt.Printf("shirt: available %d, held %d, sold %d\n", l.Available, l.Held, l.Sold)
	// Output:
	// held cap 1
	// held shirt 2
	// confirmed 2 lines: <nil>
	// shirt: available 3, held 0, sold 2
}

// A cart refused by one item is undone, and a retry of the same cart id answers the same
// *CartError: the cart id has one outcome. Retry with a new id to try again.
func ExampleCartError() {
	r, _, stop := exampleReserver()
	defer stop()
	ctx := context.Background()
	_ = r.Load(ctx, "shirt", 5)
	_ = r.Load(ctx, "cap", 0)

	cart := stock.Cart{ID: "cart-3", Lines: []stock.Line{{SKU: "shirt", Qty: 1}, {SKU: "cap", Qty: 1}}}
	for range 2 { // the first attempt, then a retry of the same cart
		_, err := r.DeductMany(ctx, cart)
		var ce *stock.CartError
		if errors.As(err, &ce) {
			fmt.Println(ce.SKU, errors.Is(err, stock.ErrSoldOut), errors.Is(err, stock.ErrRestored))
		}
	}
	l, _ := r.Levels(ctx, "shirt")
	fmt.Println("shirts available", l.Available)
	// Output:
	// cap true false
	// cap true false
	// shirts available 5
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
