package streampub_test

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
	"github.com/stockres/stock/streampub"
)

// The queue path on Redis Streams: the relay publishes a sale, a consumer of the group "store"
// applies it to the database of record through stock.Consume.
func Example() {
	ctx := context.Background()
	m, err := miniredis.Run() // any Redis; the streams may live in the Reserver's own
	if err != nil {
		panic(err)
	}
	defer m.Close()
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{m.Addr()}, DisableCache: true})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	reserver, err := stock.New(client)
	if err != nil {
		panic(err)
	}
	store := memstore.New() // the database of record
	_ = reserver.Load(ctx, "tshirt", 10)
	_ = store.Load(ctx, "tshirt", 10)
	if _, err := reserver.Deduct(ctx, stock.Request{SKU: "tshirt", ID: "order-1", Qty: 2}); err != nil {
		panic(err)
	}

	// The relay side.
	pub, err := streampub.New(client)
	if err != nil {
		panic(err)
	}
	if err := streampub.EnsureGroup(ctx, client, "store", pub.Streams()); err != nil {
		panic(err)
	}
	relay, err := stockops.NewRelay(reserver, nil, pub, nil)
	if err != nil {
		panic(err)
	}
	if _, err := relay.Once(ctx); err != nil { // or go relay.Run(ctx)
		panic(err)
	}

	// The consumer side, in the service that owns the database.
	cons, err := streampub.NewConsumer(client, "store", "host-1", pub.Streams(), nil)
	if err != nil {
		panic(err)
	}
	msgs, err := cons.Receive(ctx, 64, time.Second)
	if err != nil {
		panic(err)
	}
	for _, msg := range msgs {
		if msg.Err != nil {
			_ = cons.Ack(ctx, msg)
			continue
		}
		switch err := stock.Consume(ctx, reserver, store, msg.Event); {
		case err == nil, errors.Is(err, stock.ErrInvalid):
			_ = cons.Ack(ctx, msg)
		default: // left pending: claimed again after MinIdle
		}
	}
	remaining, _ := store.Remaining(ctx, "tshirt")
	fmt.Println(len(msgs), "event; the store has", remaining, "left")
	// Output: 1 event; the store has 8 left
}
