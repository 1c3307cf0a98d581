package stockotel_test

import (
	"log"

	"github.com/redis/rueidis"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

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
