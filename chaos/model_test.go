package main

import (
	"math"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/sqlfence/cluster"
)

func grantOp(tok uint64, call, ret int64) porcupine.Operation {
	return porcupine.Operation{Input: regInput{grant: true, token: tok}, Call: call, Return: ret}
}

func writeAt(tok uint64, seq, call, ret int64) porcupine.Operation {
	return porcupine.Operation{Input: regInput{token: tok, seq: seq}, Call: call, Return: ret}
}

// TestRegisterModel checks the fenced-register model on small histories
// whose answer is known.
func TestRegisterModel(t *testing.T) {
	tests := []struct {
		name string
		hist []porcupine.Operation
		want bool
	}{
		{"terms in order", []porcupine.Operation{grantOp(1, 0, 10), writeAt(1, 1, 20, 30), grantOp(2, 40, 50), writeAt(2, 2, 60, 70)}, true},
		{"a stale write after a later grant", []porcupine.Operation{grantOp(1, 0, 10), grantOp(2, 40, 50), writeAt(1, 1, 60, 70)}, false},
		{"a write overlapping the next grant takes effect before it", []porcupine.Operation{grantOp(1, 0, 10), writeAt(1, 1, 40, 70), grantOp(2, 50, 60), writeAt(2, 2, 80, 90)}, true},
		{"commit order against real time", []porcupine.Operation{grantOp(1, 0, 10), writeAt(1, 5, 20, 30), writeAt(1, 3, 40, 50)}, false},
		{"a committed write of unknown return", []porcupine.Operation{grantOp(1, 0, 10), writeAt(1, 1, 20, math.MaxInt64), grantOp(2, 40, 50), writeAt(2, 2, 60, 70)}, true},
		{"a write whose grant was not observed proves it", []porcupine.Operation{writeAt(3, 1, 0, 10), grantOp(2, 20, 30)}, false},
		{"one token granted twice", []porcupine.Operation{grantOp(1, 0, 10), grantOp(1, 20, 30)}, false},
		{"grants out of order", []porcupine.Operation{grantOp(2, 0, 10), grantOp(1, 20, 30)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := porcupine.CheckOperations(registerModel, tt.hist); got != tt.want {
				t.Errorf("linearizable = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestCheckFindsPlantedAnomalies plants one anomaly of each kind the
// database state and beliefs can show, and expects the checker to name it.
func TestCheckFindsPlantedAnomalies(t *testing.T) {
	ms := int64(1e6)
	base := func() (map[string][]record, *finalState) {
		hs := map[string][]record{
			"n1.1": {
				{T: 1 * ms, Kind: kGrant, Token: 1, From: 0, To: 1 * ms},
				{T: 2 * ms, Kind: kInvoke, Op: "n1.1#1", What: styleFenced},
				{T: 3 * ms, Kind: kOK, Op: "n1.1#1", Token: 1, Seq: 1},
				{T: 100 * ms, Kind: kBelief, Token: 1, From: 1 * ms, To: 100 * ms},
			},
			"n2.1": {
				{T: 800 * ms, Kind: kGrant, Token: 2, From: 700 * ms, To: 800 * ms},
				{T: 810 * ms, Kind: kInvoke, Op: "n2.1#1", What: styleFenced},
				{T: 820 * ms, Kind: kOK, Op: "n2.1#1", Token: 2, Seq: 2},
				{T: 900 * ms, Kind: kBelief, Token: 2, From: 800 * ms, To: 900 * ms},
			},
		}
		fs := &finalState{Writes: []dbWrite{{1, 1, "n1.1#1"}, {2, 2, "n2.1#1"}}, LeaseToken: 2, HighWater: 2}
		return hs, fs
	}
	run := func(hs map[string][]record, fs *finalState) *result {
		return check(checkInput{timings: testTimings, histories: hs, final: fs, end: 1000 * ms})
	}
	hs, fs := base()
	if res := run(hs, fs); len(res.Anomalies) != 0 {
		t.Fatalf("clean history: %v", res.Anomalies)
	}
	tests := []struct {
		kind  string
		plant func(map[string][]record, *finalState)
	}{
		{aOverlap, func(hs map[string][]record, _ *finalState) {
			hs["n1.1"] = append(hs["n1.1"], record{Kind: kBelief, Token: 1, From: 1 * ms, To: 850 * ms})
		}},
		{aTokenRegression, func(hs map[string][]record, fs *finalState) {
			hs["n1.1"] = append(hs["n1.1"], record{T: 830 * ms, Kind: kInvoke, Op: "n1.1#2", What: styleStaleTip, Token: 1},
				record{T: 840 * ms, Kind: kOK, Op: "n1.1#2", Token: 1, Seq: 3})
			fs.Writes = append(fs.Writes, dbWrite{3, 1, "n1.1#2"})
		}},
		{aLostWrite, func(_ map[string][]record, fs *finalState) { fs.Writes = fs.Writes[:1] }},
		{aRefusedPresent, func(hs map[string][]record, fs *finalState) {
			hs["n1.1"] = append(hs["n1.1"], record{T: 830 * ms, Kind: kInvoke, Op: "n1.1#2", What: styleStaleTip, Token: 1},
				record{T: 840 * ms, Kind: kFail, Op: "n1.1#2", Token: 1, What: "refused"})
			fs.Writes = append(fs.Writes, dbWrite{3, 2, "n1.1#2"})
		}},
		{aUnknownRow, func(_ map[string][]record, fs *finalState) { fs.Writes = append(fs.Writes, dbWrite{3, 2, "ghost"}) }},
		{aDuplicateGrant, func(hs map[string][]record, _ *finalState) {
			hs["n2.1"] = append(hs["n2.1"], record{Kind: kGrant, Token: 1, From: 950 * ms, To: 960 * ms})
		}},
		// n1's belief ends at 350 ms and token 2 is granted by 800 ms: 450
		// ms, under the 500 ms margin (LeaseTTL 2s - FenceTimeout 1.5s).
		{aMargin, func(hs map[string][]record, _ *finalState) {
			hs["n1.1"] = append(hs["n1.1"], record{Kind: kBelief, Token: 1, From: 1 * ms, To: 350 * ms})
		}},
		{aConfigRepeat, func(hs map[string][]record, fs *finalState) { bumps(hs, fs, 1, 1, 2) }},
		{aConfigLost, func(hs map[string][]record, fs *finalState) { bumps(hs, fs, 1, 2, 1) }},
		{aConfigPhantom, func(hs map[string][]record, fs *finalState) { bumps(hs, fs, 1, 2, 3) }},
		{aChainBroken, func(_ map[string][]record, fs *finalState) {
			fs.Audit = []dbAudit{{Counter: 1, Hash: []byte("not the hash"), Payload: "n1.1#1|1|1"}}
		}},
	}
	// On postgres+pgx a history in which no process heard releases is
	// never-heard; one hearing-releases event clears it.
	pgx := func(hs map[string][]record, fs *finalState) *result {
		return check(checkInput{stack: stackPgx, timings: testTimings, histories: hs, final: fs, end: 1000 * ms})
	}
	hs, fs = base()
	if res := pgx(hs, fs); len(res.Anomalies) != 1 || res.Anomalies[0].Kind != aNeverHeard {
		t.Errorf("postgres+pgx without hearing: %v; want one %s", res.Anomalies, aNeverHeard)
	}
	hs["n2.1"] = append(hs["n2.1"], record{T: 5 * ms, Kind: kEvent, What: eventHearing})
	if res := pgx(hs, fs); len(res.Anomalies) != 0 || res.Hearing != 1 {
		t.Errorf("postgres+pgx with one process hearing: %v, hearing %d", res.Anomalies, res.Hearing)
	}
	// Two bumps in sequence, versions 1 and 2, and 2 in the database: clean.
	hs, fs = base()
	bumps(hs, fs, 1, 2, 2)
	if res := run(hs, fs); len(res.Anomalies) != 0 || res.Bumps != 2 || res.BumpsOK != 2 {
		t.Errorf("clean bumps: %v, %d bumps (%d acknowledged)", res.Anomalies, res.Bumps, res.BumpsOK)
	}
	// A clean history measures its margin: 700 ms, over one expired term.
	hs, fs = base()
	if res := run(hs, fs); res.MinMargin != 700*time.Millisecond || res.Margins != 1 || res.Margin != 500*time.Millisecond {
		t.Errorf("clean history's margin: smallest %v over %d terms, promised %v; want 700ms over 1, 500ms", res.MinMargin, res.Margins, res.Margin)
	}
	// The same short gap after a release is no violation: a released
	// term may be followed at once.
	hs["n1.1"] = append(hs["n1.1"], record{Kind: kBelief, Token: 1, From: 1 * ms, To: 350 * ms},
		record{T: 351 * ms, Kind: kEvent, Token: 1, What: string(cluster.EventLeaseReleased)})
	if res := run(hs, fs); len(res.Anomalies) != 0 || res.Margins != 0 {
		t.Errorf("a released term followed within the margin: %v (%d terms measured); want none", res.Anomalies, res.Margins)
	}
	for _, tt := range tests {
		t.Run(tt.kind, func(t *testing.T) {
			hs, fs := base()
			tt.plant(hs, fs)
			res := run(hs, fs)
			for _, a := range res.Anomalies {
				if a.Kind == tt.kind {
					return
				}
			}
			t.Errorf("no %s among %v", tt.kind, res.Anomalies)
		})
	}
}

// bumps adds two config-version bumps to hs, n1's returning v1 and, after
// it, n2's returning v2, and final as the database's version.
func bumps(hs map[string][]record, fs *finalState, v1, v2, final int64) {
	ms := int64(1e6)
	hs["n1.1"] = append(hs["n1.1"], record{T: 10 * ms, Kind: kBump, What: "call"},
		record{T: 20 * ms, Kind: kBump, What: "ok", From: 10 * ms, To: 20 * ms, Seq: v1})
	hs["n2.1"] = append(hs["n2.1"], record{T: 30 * ms, Kind: kBump, What: "call"},
		record{T: 40 * ms, Kind: kBump, What: "ok", From: 30 * ms, To: 40 * ms, Seq: v2})
	fs.ConfigVersion = final
}
