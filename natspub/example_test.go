package natspub_test

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/stockres/stock"
	"github.com/stockres/stock/natspub"
	"github.com/stockres/stock/stockops"
)

// The relay publishes the Reserver's events to JetStream; a consumer in the service that owns
// the database applies them to its Store. (Compiled, not run: it needs Redis, NATS and a
// database.)
func Example() {
	ctx := context.Background()
	var (
		reserver *stock.Reserver // from stock.New
		store    stock.Store     // the database of record
	)

	nc, err := nats.Connect("nats://127.0.0.1:4222")
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := natspub.EnsureStream(ctx, js, "STOCK", natspub.DefaultPrefix); err != nil {
		log.Fatal(err)
	}

	// Relay side: Reserver outbox → Relay → natspub → JetStream.
	pub, err := natspub.New(js, natspub.WithStream("STOCK"), natspub.WithTimeout(5*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	relay, err := stockops.NewRelay(reserver, nil, pub, nil)
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = relay.Run(ctx) }()

	// Consumer side: JetStream → pull consumer → stock.Consume → Store.
	cons, err := js.CreateOrUpdateConsumer(ctx, "STOCK", jetstream.ConsumerConfig{
		Durable:       "store",
		AckPolicy:     jetstream.AckExplicitPolicy,
		FilterSubject: natspub.DefaultPrefix + ".>",
	})
	if err != nil {
		log.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		ev, err := natspub.Decode(m.Data())
		if err != nil {
			_ = m.Term() // garbage stays garbage: never deliver it again
			return
		}
		switch err := stock.Consume(ctx, reserver, store, ev); {
		case err == nil:
			_ = m.Ack() // applied, or refused and given back in Redis
		case errors.Is(err, stock.ErrInvalid):
			_ = m.Term()
		default:
			// stock.ErrHeldBack (it must wait for an earlier event of the item) or a
			// temporary error: JetStream delivers it again after the delay.
			_ = m.NakWithDelay(time.Second)
		}
	})
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Stop()
}
