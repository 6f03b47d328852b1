package main

import (
	"fmt"
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
				{T: 3 * ms, Kind: kOK, Op: "n1.1#1", Token: 1, Seq: 2},
				{T: 100 * ms, Kind: kBelief, Token: 1, From: 1 * ms, To: 100 * ms},
			},
			"n2.1": {
				{T: 800 * ms, Kind: kGrant, Token: 2, From: 700 * ms, To: 800 * ms},
				{T: 810 * ms, Kind: kInvoke, Op: "n2.1#1", What: styleFenced},
				{T: 820 * ms, Kind: kOK, Op: "n2.1#1", Token: 2, Seq: 4},
				{T: 900 * ms, Kind: kBelief, Token: 2, From: 800 * ms, To: 900 * ms},
			},
		}
		// The counter's order: n1's grant, its write, n2's grant, its write.
		fs := &finalState{Writes: []dbWrite{{2, 1, "n1.1#1", ""}, {4, 2, "n2.1#1", ""}}, LeaseToken: 2, HighWater: 2,
			Terms: []dbTerm{{Seq: 1, Token: 1, Holder: "n1", Instance: "i1"}, {Seq: 3, Token: 2, Holder: "n2", Instance: "i2"}}}
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
				record{T: 840 * ms, Kind: kOK, Op: "n1.1#2", Token: 1, Seq: 5})
			fs.Writes = append(fs.Writes, dbWrite{5, 1, "n1.1#2", ""})
		}},
		{aLostWrite, func(_ map[string][]record, fs *finalState) { fs.Writes = fs.Writes[:1] }},
		{aRefusedPresent, func(hs map[string][]record, fs *finalState) {
			hs["n1.1"] = append(hs["n1.1"], record{T: 830 * ms, Kind: kInvoke, Op: "n1.1#2", What: styleStaleTip, Token: 1},
				record{T: 840 * ms, Kind: kFail, Op: "n1.1#2", Token: 1, What: "refused"})
			fs.Writes = append(fs.Writes, dbWrite{5, 2, "n1.1#2", ""})
		}},
		{aUnknownRow, func(_ map[string][]record, fs *finalState) { fs.Writes = append(fs.Writes, dbWrite{5, 2, "ghost", ""}) }},
		{aDuplicateGrant, func(hs map[string][]record, _ *finalState) {
			hs["n2.1"] = append(hs["n2.1"], record{Kind: kGrant, Token: 1, From: 950 * ms, To: 960 * ms})
		}},
		// n1's belief ends at 350 ms and token 2 is granted by 800 ms: 450
		// ms, under the 500 ms margin (LeaseTTL 2s - FenceTimeout 1.5s).
		{aMargin, func(hs map[string][]record, _ *finalState) {
			hs["n1.1"] = append(hs["n1.1"], record{Kind: kBelief, Token: 1, From: 1 * ms, To: 350 * ms})
		}},
		// The database's order: n1's write numbered after n2's grant.
		{aStaleCommit, func(_ map[string][]record, fs *finalState) {
			fs.Writes[0].Seq, fs.Terms[1].Seq = 3, 2
		}},
		// n1's term released (an operator's release) before its write.
		{aAfterRelease, func(_ map[string][]record, fs *finalState) {
			fs.Writes = []dbWrite{{3, 1, "n1.1#1", ""}, {5, 2, "n2.1#1", ""}}
			fs.Terms = []dbTerm{{Seq: 1, Token: 1, Holder: "n1", Instance: "i1"}, {Seq: 2, Token: 1, Holder: "n1", Instance: "i1", Ended: true}, {Seq: 4, Token: 2, Holder: "n2", Instance: "i2"}}
		}},
		{aEarlyCommit, func(_ map[string][]record, fs *finalState) { fs.Terms[0].Seq, fs.Writes[0].Seq = 2, 1 }},
		// Lane a: claimed by n1 (token 1), then by n2 (token 2), and a
		// write of n1 under token 1 numbered after n2's claim.
		{aStaleCommit, func(hs map[string][]record, fs *finalState) {
			hs["n1.1"] = append(hs["n1.1"], record{T: 850 * ms, Kind: kInvoke, Op: "n1.1#9", What: styleLane, Lane: "a", Token: 1},
				record{T: 860 * ms, Kind: kOK, Op: "n1.1#9", Lane: "a", Token: 1, Seq: 7})
			fs.Terms = append(fs.Terms, dbTerm{Seq: 5, Lane: "a", Token: 1, Holder: "n1", Instance: "i1"}, dbTerm{Seq: 6, Lane: "a", Token: 2, Holder: "n2", Instance: "i2"})
			fs.LaneWrites = []dbWrite{{7, 1, "n1.1#9", "a"}}
		}},
		{aTokenReused, func(_ map[string][]record, fs *finalState) {
			fs.Terms = append(fs.Terms, dbTerm{Seq: 5, Lane: "a", Token: 1, Holder: "n1", Instance: "i1"}, dbTerm{Seq: 6, Lane: "a", Token: 1, Holder: "n2", Instance: "i2"})
		}},
		{aTokenReused, func(_ map[string][]record, fs *finalState) {
			fs.Terms = append(fs.Terms, dbTerm{Seq: 5, Token: 2, Holder: "n2", Instance: "i3"})
		}},
		{aTermOrder, func(_ map[string][]record, fs *finalState) {
			fs.Terms = append(fs.Terms, dbTerm{Seq: 5, Token: 1, Holder: "n1", Instance: "i1"})
		}},
		{aSeqGap, func(_ map[string][]record, fs *finalState) { fs.Terms[1].Seq = 6 }},
		{aFalseRollback, func(hs map[string][]record, _ *finalState) {
			hs["n1.1"] = append(hs["n1.1"], record{T: 500 * ms, Kind: kEvent, What: "new-failed " + string(cluster.EventRollbackDetected), Err: "rollback"})
		}},
		{aGuardRefused, func(hs map[string][]record, _ *finalState) {
			hs["n2.1"] = append(hs["n2.1"], record{T: 500 * ms, Kind: kEvent, What: eventGuardRefused + " " + string(cluster.OpClaimLane), Err: "SF009"})
		}},
		{aConfigRepeat, func(hs map[string][]record, fs *finalState) { bumps(hs, fs, 1, 1, 2) }},
		{aConfigLost, func(hs map[string][]record, fs *finalState) { bumps(hs, fs, 1, 2, 1) }},
		{aConfigPhantom, func(hs map[string][]record, fs *finalState) { bumps(hs, fs, 1, 2, 3) }},
		{aChainBroken, func(_ map[string][]record, fs *finalState) {
			fs.Audit = []dbAudit{{Counter: 1, Hash: []byte("not the hash"), Payload: "n1.1#1|1|2"}}
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
	// The term log counts the lease's terms, and those won again by the
	// node that held the one before (n2's release, then n2's next term).
	hs, fs = base()
	if res := run(hs, fs); res.Terms != 2 || res.Again != 0 {
		t.Errorf("terms %d (again %d); want 2 (0)", res.Terms, res.Again)
	}
	fs.Terms = append(fs.Terms, dbTerm{Seq: 5, Token: 2, Holder: "n2", Instance: "i2", Ended: true},
		dbTerm{Seq: 6, Token: 3, Holder: "n2", Instance: "i3"})
	if res := run(hs, fs); res.Terms != 3 || res.Again != 1 {
		t.Errorf("after n2 won again: terms %d (again %d); want 3 (1)", res.Terms, res.Again)
	}
	// An operator released n1's term (token 1) at 100–200 ms: n1 may
	// believe on until its trust ends, FenceTimeout after the release at
	// most, while n2 leads; not past that, and not when the term log
	// shows no release.
	forced := func(beliefTo int64, logged bool) *result {
		hs, fs := base()
		hs["n1.1"] = append(hs["n1.1"], record{Kind: kBelief, Token: 1, From: 1 * ms, To: beliefTo})
		if logged {
			// The release took the counter's number 3; n2's grant and write follow.
			fs.Terms = []dbTerm{fs.Terms[0], {Seq: 3, Token: 1, Holder: "n1", Instance: "i1", Ended: true}, {Seq: 4, Token: 2, Holder: "n2", Instance: "i2"}}
			fs.Writes[1].Seq = 5
			hs["n2.1"][2].Seq = 5
		}
		return check(checkInput{timings: testTimings, histories: hs, final: fs, end: 1000 * ms,
			faults: []fault{{Kind: faultRelease, Node: "n1", Start: 100 * ms, End: 200 * ms, Token: 1}}})
	}
	if res := forced(850*ms, true); len(res.Anomalies) != 0 {
		t.Errorf("a released holder believing within FenceTimeout of the release: %v; want none", res.Anomalies)
	}
	if res := forced(850*ms, false); !hasKind(res, aOverlap) {
		t.Errorf("an overlap after a release the term log does not show: %v; want %s", res.Anomalies, aOverlap)
	}
	if res := forced(1800*ms, true); !hasKind(res, aOverlap) {
		t.Errorf("a released holder believing past FenceTimeout after the release: %v; want %s", res.Anomalies, aOverlap)
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

// TestGuardRefused checks which errors of the library's statements the
// harness reports as guard-refused: the guards that only bugs and raw SQL
// meet, not the answers a stale writer gets.
func TestGuardRefused(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{fmt.Errorf("claim lane: %w", cluster.ErrTokenLowered), true},
		{fmt.Errorf("acquire: %w", cluster.ErrLeaseDeleted), true},
		{cluster.ErrLaneDeleted, true},
		{cluster.ErrTipRewritten, true},
		{fmt.Errorf("fence: %w", cluster.ErrStaleFencingToken), false},
		{cluster.ErrTipBackwards, false},
		{cluster.ErrLaneHeld, false},
		{cluster.ErrRollbackDetected, false},
	} {
		if got := guardRefused(c.err); got != c.want {
			t.Errorf("guardRefused(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func hasKind(res *result, kind string) bool {
	for _, a := range res.Anomalies {
		if a.Kind == kind {
			return true
		}
	}
	return false
}
