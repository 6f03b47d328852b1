package main

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
)

// With cover, a schedule draws as many kinds as it has steps, up to every
// kind the dialect takes, and differs from the seed's plain schedule only in the kinds
// (and their parameters) of the steps it replaced: the rests, and so the
// rhythm of the run, stay.
func TestScheduleCovers(t *testing.T) {
	for _, d := range []cluster.Dialect{cluster.SQLite, cluster.Postgres, cluster.MySQL} {
		kinds := faultKinds(d, stackSQL)
		for seed := uint64(1); seed <= 20; seed++ {
			plain := schedule(rand.New(rand.NewPCG(seed, 1)), kinds, 3, testTimings, 40*time.Second, 0.75, false)
			covered := schedule(rand.New(rand.NewPCG(seed, 1)), kinds, 3, testTimings, 40*time.Second, 0.75, true)
			if len(plain) != len(covered) {
				t.Fatalf("%s seed %d: %d steps covered, %d plain", d, seed, len(covered), len(plain))
			}
			drawn := map[string]bool{}
			for i, s := range covered {
				drawn[s.Kind] = true
				if s.Rest != plain[i].Rest || s.Leader != plain[i].Leader || s.Fallback != plain[i].Fallback {
					t.Fatalf("%s seed %d: step %d moved: %v, plain %v", d, seed, i, s, plain[i])
				}
			}
			if want := min(len(kinds), len(covered)); len(drawn) != want {
				t.Errorf("%s seed %d: %d kinds drawn over %d steps, want %d", d, seed, len(drawn), len(covered), want)
			}
		}
	}
}
