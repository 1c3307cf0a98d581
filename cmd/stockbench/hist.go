package main

import (
	"math/bits"
	"time"
)

// histogram is a latency histogram with logarithmic buckets, in the manner of HdrHistogram:
// values below 64 ns have a bucket each, and every power of two above is split into 32 linear
// sub-buckets, so a reported quantile is within about 3% of the true value. Recording is a few
// instructions and never allocates. A histogram is owned by one goroutine; merge them at the end.
type histogram struct {
	counts [histBuckets]uint64
	n      uint64
	max    int64
}

const (
	histSubBits = 5
	histSub     = 1 << histSubBits              // sub-buckets per power of two
	histBuckets = (64-histSubBits)*histSub + 64 // enough for any non-negative int64
)

// bucketOf returns the bucket of v (nanoseconds, v >= 0).
func bucketOf(v int64) int {
	if v < 2*histSub {
		return int(v)
	}
	shift := bits.Len64(uint64(v)) - (histSubBits + 1)
	return (shift+1)*histSub + int(v>>shift) - histSub
}

// bucketRange returns the smallest value of bucket i and its width.
func bucketRange(i int) (low, width int64) {
	if i < 2*histSub {
		return int64(i), 1
	}
	shift := i/histSub - 1
	return int64(i%histSub+histSub) << shift, 1 << shift
}

func (h *histogram) record(d time.Duration) {
	v := int64(d)
	if v < 0 {
		v = 0
	}
	h.counts[bucketOf(v)]++
	h.n++
	if v > h.max {
		h.max = v
	}
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.max = max(h.max, o.max)
}

// quantile returns the value below which a share q of the recorded values lie: the middle of the
// bucket that holds the value of rank ceil(q*n), never more than the largest value recorded,
// which is the answer for the last rank. It is 0 for an empty histogram.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q * float64(h.n))
	if float64(rank) < q*float64(h.n) {
		rank++
	}
	rank = max(rank, 1)
	if rank >= h.n {
		return time.Duration(h.max)
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			low, width := bucketRange(i)
			return time.Duration(min(low+width/2, h.max))
		}
	}
	return time.Duration(h.max)
}
