package natspub_test

import (
	"testing"

	"github.com/stockres/stock/internal/queuetest"
	"github.com/stockres/stock/natspub"
)

// BenchmarkPublish measures events/s published one by one (Publish: one acknowledgement waited
// for each) and in batches of 128 events of one item (PublishBatch: 128 asynchronous publishes,
// then their acknowledgements, as the Relay calls it), on the server of STOCK_TEST_NATS:
//
//	STOCK_TEST_NATS=nats://127.0.0.1:4222 go test -run '^$' -bench Publish -benchtime 3s ./natspub
func BenchmarkPublish(b *testing.B) {
	e := newEnv(b)
	p, err := natspub.New(e.js, natspub.WithPrefix(e.prefix), natspub.WithStream(e.stream))
	if err != nil {
		b.Fatal(err)
	}
	queuetest.BenchPublish(b, p)
}
