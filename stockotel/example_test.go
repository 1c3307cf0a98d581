package stockotel_test

import (
	"context"
	"log"

	"github.com/redis/rueidis"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/stockres/stock"
	"github.com/stockres/stock/stockotel"
)

// Wire the observer into a Reserver; its relays and reconcilers report through it too.
func ExampleNew() {
	mp := sdkmetric.NewMeterProvider() // add a reader or exporter: sdkmetric.WithReader(...)
	obs, err := stockotel.New(mp)      // stockotel.WithSKUAttribute(true) for per-item series
	if err != nil {
		log.Fatal(err)
	}
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	r, err := stock.New(client, stock.WithObserver(obs))
	if err != nil {
		log.Fatal(err)
	}
	_ = r
}

// Record a span per operation too, a child of the caller's span. With a traced Redis client
// (rueidisotel.NewClient with the same tracer provider), each operation's Redis commands are
// the children of its span.
func ExampleWithTracerProvider() {
	tp := sdktrace.NewTracerProvider() // add an exporter: sdktrace.WithBatcher(...)
	defer tp.Shutdown(context.Background())
	obs, err := stockotel.New(sdkmetric.NewMeterProvider(), stockotel.WithTracerProvider(tp))
	if err != nil {
		log.Fatal(err)
	}
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	r, err := stock.New(client, stock.WithObserver(obs))
	if err != nil {
		log.Fatal(err)
	}
	ctx, span := tp.Tracer("shop").Start(context.Background(), "POST /checkout")
	defer span.End()
	_, _ = r.Deduct(ctx, stock.Request{SKU: "sneaker-42", ID: "order-1", User: "alice", Qty: 1})
}
