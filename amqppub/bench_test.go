package amqppub_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stockres/stock/amqppub"
	"github.com/stockres/stock/internal/queuetest"
)

// BenchmarkPublish measures events/s published one by one (Publish: one confirm waited for
// each) and in batches of 128 events of one item (PublishBatch: 128 messages, then their
// confirms, as the Relay calls it), on the RabbitMQ server of STOCK_TEST_AMQP:
//
//	STOCK_TEST_AMQP=amqp://guest:guest@127.0.0.1:5672/ go test -run '^$' -bench Publish -benchtime 3s ./  (in amqppub/)
func BenchmarkPublish(b *testing.B) {
	u := url(b)
	pub, err := amqppub.New(dial(b, u), layout(b, u, 4)...)
	require.NoError(b, err)
	queuetest.BenchPublish(b, pub)
}
