package protocol

import (
	"reflect"
	"testing"
)

func TestParseSnapshotReply(t *testing.T) {
	got, err := ParseSnapshotReply([]string{"1", "5", "2", "3", "10", "1", "0", "1", "-4", "D:a", "Dr|1|5|1|", "D:b", ""})
	want := SnapshotReply{Exists: true, Available: 5, Held: 2, Sold: 3, Loaded: 10, Pending: 1, Published: 1, Transferred: -4,
		Events: []OutboxEvent{{Member: "D:a", Entry: "Dr|1|5|1|"}, {Member: "D:b"}}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ParseSnapshotReply = %+v, %v", got, err)
	}
	if got, err := ParseSnapshotReply([]string{"0", "0", "0", "0", "0", "0", "0", "0", "0"}); err != nil || got.Exists || len(got.Events) != 0 {
		t.Fatalf("a missing item: %+v, %v", got, err)
	}
	for _, n := range []int{0, 8, 10} {
		if _, err := ParseSnapshotReply(make([]string, n)); err == nil {
			t.Errorf("%d values accepted", n)
		}
	}
}

func TestParseClaimReply(t *testing.T) {
	got, err := ParseClaimReply([]string{"D:a", "Dr|1|5|1|", "2", "7", "R:b", "", "0", "8"})
	want := []OutboxEvent{{Member: "D:a", Entry: "Dr|1|5|1|", Tries: 2, Seq: 7}, {Member: "R:b", Seq: 8}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ParseClaimReply = %+v, %v", got, err)
	}
	if _, err := ParseClaimReply(make([]string, 3)); err == nil {
		t.Error("3 values accepted")
	}
}

func TestParseTurnReply(t *testing.T) {
	got, err := ParseTurnReply([]string{"1", "D:a", "Dr|1|5|1|", "7"})
	want := TurnReply{More: true, Earlier: []OutboxEvent{{Member: "D:a", Entry: "Dr|1|5|1|", Seq: 7}}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ParseTurnReply = %+v, %v", got, err)
	}
	if got, err := ParseTurnReply([]string{"2"}); err != nil || !got.Reconciling || got.More {
		t.Fatalf("reconciling: %+v, %v", got, err)
	}
	for _, n := range []int{0, 2, 3} {
		if _, err := ParseTurnReply(make([]string, n)); err == nil {
			t.Errorf("%d values accepted", n)
		}
	}
}
