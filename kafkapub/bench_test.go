package kafkapub_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stockres/stock/internal/queuetest"
	"github.com/stockres/stock/kafkapub"
)

// BenchmarkPublish measures events/s published one by one (Publish: one ProduceSync of one
// record each) and in batches of 128 events of one item (PublishBatch: one ProduceSync of 128
// records, as the Relay calls it), on the in-process fake cluster: a figure of the client and
// the protocol round trips, not of a real cluster's disks and replication.
//
//	go test -run '^$' -bench Publish -benchtime 3s ./  (in kafkapub/)
func BenchmarkPublish(b *testing.B) {
	pub, err := kafkapub.New(producer(b, fakeCluster(b, 4)), topic)
	require.NoError(b, err)
	queuetest.BenchPublish(b, pub)
}
