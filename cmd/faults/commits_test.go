package main

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/assert"
)

// The windows are cut to what the commit numbering implies: after every
// lower-numbered movement's stamp (less the clocks' slack) and the sending
// of its request, before every higher-numbered one's answer.
func TestCommitWindows(t *testing.T) {
	hold := func(ref string, call, ret int) porcupine.Operation {
		op := &histOp{Kind: opCreate}
		return porcupine.Operation{Input: &skuInput{op: op, kind: opCreate, out: outOK, ref: ref}, Call: int64(ms(call)), Return: int64(ms(ret))}
	}
	read := porcupine.Operation{Input: &skuInput{op: &histOp{Kind: opRead}, kind: opRead, out: outOK}, Call: int64(ms(5)), Return: int64(ms(500))}
	h := []porcupine.Operation{
		hold("o1", 0, 300),  // committed second
		hold("o2", 10, 200), // committed first
		hold("o3", 20, 100), // stamped after its answer: left as it was, and bounds nothing
		hold("o4", 30, 400), // no movement: left as it was
		read,
		hold("o5", 50, 250), // committed last
	}
	commits := []commit{
		{SKU: "S", Position: 1, Kind: "RESERVE", Ref: "o2", At: ms(150)},
		{SKU: "S", Position: 2, Kind: "RESERVE", Ref: "o1", At: ms(160)},
		{SKU: "S", Position: 3, Kind: "RELEASE", Ref: "o1", At: ms(170)}, // the first RESERVE is the hold's
		{SKU: "S", Position: 4, Kind: "RESERVE", Ref: "o3", At: ms(250)},
		{SKU: "S", Position: 5, Kind: "RESERVE", Ref: "o5", At: ms(240)},
	}
	got := commitWindows(h, commits)
	window := func(o porcupine.Operation) [2]int64 { return [2]int64{o.Call, o.Return} }
	cut := func(lo, hi time.Duration) [2]int64 { return [2]int64{int64(lo), int64(hi)} }
	assert.Equal(t, cut(ms(110), ms(250)), window(got[0]), "after o2's stamp and its own, before o5's answer")
	assert.Equal(t, cut(ms(100), ms(200)), window(got[1]), "after its stamp, before its answer")
	assert.Equal(t, cut(ms(190), ms(250)), window(got[5]), "after its own stamp")
	assert.Equal(t, window(h[2]), window(got[2]))
	assert.Equal(t, window(h[3]), window(got[3]))
	assert.Equal(t, window(h[4]), window(got[4]))
	assert.Equal(t, int64(ms(0)), h[0].Call, "h itself is left as it was")
}
