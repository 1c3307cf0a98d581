package kafkapub_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/stockres/stock"
	"github.com/stockres/stock/kafkapub"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/stockops"
)

// The queue path on Kafka (here franz-go's in-process fake cluster): the relay publishes a sale,
// a member of the consumer group "store" applies it to the database of record through
// stock.Consume.
func Example() {
	ctx := context.Background()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "stock-events"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	m, err := miniredis.Run()
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

	// The relay side: franz-go's defaults are what kafkapub needs (idempotent, acks=all).
	producer, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		panic(err)
	}
	defer producer.Close()
	pub, err := kafkapub.New(producer, "stock-events")
	if err != nil {
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
	cons, err := kafkapub.NewConsumer("stock-events", "store", nil, kgo.SeedBrokers(brokers...))
	if err != nil {
		panic(err)
	}
	defer cons.Close()
	applied := 0
	for deadline := time.Now().Add(10 * time.Second); applied == 0 && time.Now().Before(deadline); {
		msgs, _ := cons.Receive(ctx, 64, time.Second)
		for _, msg := range msgs {
			if msg.Err != nil {
				_ = cons.Ack(ctx, msg)
				continue
			}
			switch err := stock.Consume(ctx, reserver, store, msg.Event); {
			case err == nil, errors.Is(err, stock.ErrInvalid):
				_ = cons.Ack(ctx, msg)
				applied++
			default:
				cons.Retry(msg)
			}
		}
	}
	remaining, _ := store.Remaining(ctx, "tshirt")
	fmt.Println(applied, "event; the store has", remaining, "left")
	// Output: 1 event; the store has 8 left
}
