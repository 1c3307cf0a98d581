package protocol

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestParseReplies: each reply parser reads its script's reply into what the reply says, and
// refuses a reply with a wrong number of values.
func TestParseReplies(t *testing.T) {
	for _, tc := range []struct {
		name  string
		parse func([]string) (any, error)
		in    []string
		want  any
		bad   []int // numbers of values refused
	}{
		{"snapshot", anyReply(ParseSnapshotReply),
			[]string{"1", "5", "2", "3", "10", "1", "0", "1", "-4", "D:a", "Dr|1|5|1|", "D:b", ""},
			SnapshotReply{Exists: true, Available: 5, Held: 2, Sold: 3, Loaded: 10, Pending: 1, Published: 1, Transferred: -4,
				Events: []OutboxEvent{{Member: "D:a", Entry: "Dr|1|5|1|"}, {Member: "D:b"}}},
			[]int{0, 8, 10}},
		{"snapshot of a missing item", anyReply(ParseSnapshotReply),
			[]string{"0", "0", "0", "0", "0", "0", "0", "0", "0"}, SnapshotReply{Events: []OutboxEvent{}}, nil},
		{"claim", anyReply(ParseClaimReply),
			[]string{"D:a", "Dr|1|5|1|", "2", "7", "R:b", "", "0", "8"},
			[]OutboxEvent{{Member: "D:a", Entry: "Dr|1|5|1|", Tries: 2, Seq: 7}, {Member: "R:b", Seq: 8}},
			[]int{3}},
		{"turn", anyReply(ParseTurnReply),
			[]string{"1", "D:a", "Dr|1|5|1|", "7"},
			TurnReply{More: true, Earlier: []OutboxEvent{{Member: "D:a", Entry: "Dr|1|5|1|", Seq: 7}}},
			[]int{0, 2, 3}},
		{"turn while reconciling", anyReply(ParseTurnReply), []string{"2"}, TurnReply{Reconciling: true}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.parse(tc.in)
			assert.NoError(t, err)
			assert.Equal(t, tc.want, got)
			for _, n := range tc.bad {
				_, err := tc.parse(make([]string, n))
				assert.Error(t, err, "%d values accepted", n)
			}
		})
	}
}

// anyReply is parse with its reply as an any.
func anyReply[T any](parse func([]string) (T, error)) func([]string) (any, error) {
	return func(in []string) (any, error) { return parse(in) }
}
