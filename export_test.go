package stock

// SplitForTest makes r split every item over n buckets (see bucket.go), for the tests of
// package stock_test: users cannot split items yet.
func SplitForTest(r *Reserver, n int) {
	r.opts.buckets = func(string) int { return n }
}
