package amqppub_test

import (
	"context"
	"errors"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/stockres/stock"
	"github.com/stockres/stock/amqppub"
	"github.com/stockres/stock/stockops"
)

// The relay side: publish each item's events with publisher confirms.
func ExampleNew() {
	var reserver *stock.Reserver // from stock.New
	ctx := context.Background()
	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	pub, err := amqppub.New(conn) // declares the exchange and its queues
	if err != nil {
		panic(err)
	}
	relay, err := stockops.NewRelay(reserver, nil, pub, nil)
	if err != nil {
		panic(err)
	}
	_ = relay.Run(ctx)
}

// The consumer side, in the service that owns the database: every process consumes from every
// queue, and RabbitMQ makes one of them active per queue.
func ExampleNewConsumer() {
	var (
		reserver *stock.Reserver // from stock.New
		store    stock.Store     // the database of record
	)
	ctx := context.Background()
	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	cons, err := amqppub.NewConsumer(conn, nil)
	if err != nil {
		panic(err)
	}
	defer cons.Close()
	for ctx.Err() == nil {
		msgs, err := cons.Receive(ctx, 64, time.Second)
		if err != nil {
			panic(err) // the channel closed: reconnect
		}
		for _, m := range msgs {
			if m.Err != nil {
				_ = cons.Ack(m) // garbage stays garbage
				continue
			}
			switch err := stock.Consume(ctx, reserver, store, m.Event); {
			case err == nil, errors.Is(err, stock.ErrInvalid):
				_ = cons.Ack(m)
			default:
				cons.Retry(m) // requeued after a delay
			}
		}
	}
}
