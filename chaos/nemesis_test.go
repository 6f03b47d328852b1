package main

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
)

// With cover, a schedule draws every kind the dialect takes, and differs
// from the seed's plain schedule only in the kinds (and their parameters)
// of the steps it replaced, and in the steps it added at the end: the
// rests, and so the rhythm of the run, stay.
func TestScheduleCovers(t *testing.T) {
	for _, d := range []cluster.Dialect{cluster.SQLite, cluster.Postgres, cluster.MySQL} {
		kinds := faultKinds(d, stackSQL)
		for _, dur := range []time.Duration{10 * time.Second, 40 * time.Second} {
			for seed := uint64(1); seed <= 20; seed++ {
				plain := schedule(rand.New(rand.NewPCG(seed, 1)), kinds, 3, testTimings, dur, 0.75, false)
				covered := schedule(rand.New(rand.NewPCG(seed, 1)), kinds, 3, testTimings, dur, 0.75, true)
				if len(covered) < len(plain) {
					t.Fatalf("%s seed %d: %d steps covered, %d plain", d, seed, len(covered), len(plain))
				}
				drawn := map[string]bool{}
				for i, s := range covered {
					drawn[s.Kind] = true
					if i < len(plain) && (s.Rest != plain[i].Rest || s.Leader != plain[i].Leader || s.Fallback != plain[i].Fallback) {
						t.Fatalf("%s seed %d: step %d moved: %v, plain %v", d, seed, i, s, plain[i])
					}
				}
				if len(drawn) != len(kinds) {
					t.Errorf("%s %v seed %d: %d kinds drawn over %d steps, want all %d", d, dur, seed, len(drawn), len(covered), len(kinds))
				}
				if len(plain) >= len(kinds) && len(covered) != len(plain) {
					t.Errorf("%s %v seed %d: %d steps covered, %d plain: steps added though the plain schedule had enough", d, dur, seed, len(covered), len(plain))
				}
			}
		}
	}
}
