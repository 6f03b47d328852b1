package main

import (
	"math/rand/v2"
	"testing"
)

// Every system gets exactly n trials, in blocks of at most block, one
// turn each per round, and the order of the turns varies between rounds.
func TestTurns(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct{ systems, n, block int }{{3, 30, 5}, {3, 31, 5}, {2, 7, 3}, {1, 4, 4}, {4, 1, 5}} {
		ts := turns(c.systems, c.n, c.block, rng)
		got := make([]int, c.systems)
		rounds := (c.n + c.block - 1) / c.block
		if len(ts) != rounds*c.systems {
			t.Fatalf("turns(%d, %d, %d): %d turns, want %d", c.systems, c.n, c.block, len(ts), rounds*c.systems)
		}
		for r := range rounds {
			seen := map[int]bool{}
			for _, tr := range ts[r*c.systems : (r+1)*c.systems] {
				if seen[tr.system] {
					t.Fatalf("turns(%d, %d, %d): system %d twice in round %d: %v", c.systems, c.n, c.block, tr.system, r, ts)
				}
				seen[tr.system] = true
				if tr.trials < 1 || tr.trials > c.block {
					t.Fatalf("turns(%d, %d, %d): a turn of %d trials", c.systems, c.n, c.block, tr.trials)
				}
				got[tr.system] += tr.trials
			}
		}
		for i, g := range got {
			if g != c.n {
				t.Errorf("turns(%d, %d, %d): system %d runs %d trials, want %d", c.systems, c.n, c.block, i, g, c.n)
			}
		}
	}
	// Over many rounds of three systems, each comes first sometimes.
	first := map[int]int{}
	ts := turns(3, 300, 1, rng)
	for r := 0; r < len(ts); r += 3 {
		first[ts[r].system]++
	}
	for i := range 3 {
		if first[i] < 50 {
			t.Errorf("system %d went first in %d of 300 rounds; the order is not shuffled", i, first[i])
		}
	}
}
