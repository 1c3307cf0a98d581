package contract_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// ctx is the context of every call a test makes without a deadline of its own.
var ctx = context.Background()

// errOf is the error of a call whose value the test does not need, so that one assertion
// states what the call must answer: require.NoError(t, errOf(r.Deduct(ctx, req))).
func errOf[T any](_ T, err error) error { return err }

// must requires that a call answered no error and gives its value:
// rc := must(r.Deduct(ctx, req))(t, "what the call is").
func must[T any](v T, err error) func(t *testing.T, msgAndArgs ...any) T {
	return func(t *testing.T, msgAndArgs ...any) T {
		t.Helper()
		require.NoError(t, err, msgAndArgs...)
		return v
	}
}
