package protocol

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseTransfer(t *testing.T) {
	for s, want := range map[string]Transfer{
		"O|2|5|1700|42": {Dir: 'O', Other: 2, Units: 5, AtMs: 1700, Seq: 42},
		"O|2|5|1700":    {Dir: 'O', Other: 2, Units: 5, AtMs: 1700}, // written before seq was recorded
		"I|0|3|1800":    {Dir: 'I', Other: 0, Units: 3, AtMs: 1800},
	} {
		got, err := ParseTransfer(s)
		require.NoError(t, err, s)
		assert.Equal(t, want, got, s)
	}
	for _, s := range []string{"", "O|2|5", "I|0|3|1800|4", "O|2|0|1700|1", "O|2|5|1700|-1", "O|2|5|1700|x", "X|2|5|1700", "O|2|5|1700|1|2"} {
		_, err := ParseTransfer(s)
		assert.Error(t, err, s)
	}
}

func TestBarrierMember(t *testing.T) {
	b := Barrier{Donor: 3, Seq: 17, TID: "00ff"}
	got, err := ParseBarrier(BarrierMember(b))
	require.NoError(t, err)
	assert.Equal(t, b, got)
	for _, s := range []string{"", "3|17", "3|17|", "x|17|t", "3|0|t", "-1|2|t"} {
		_, err := ParseBarrier(s)
		assert.Error(t, err, s)
	}
}
