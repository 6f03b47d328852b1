package cluster_test

import (
	"sync"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// A follower waits a random 80% to 120% of the heartbeat between two
// attempts, not exactly one heartbeat after the last one ended: followers
// that tried together (at a crashed leader's expiry, say) would otherwise
// poll together for good. An attempt starting less than a heartbeat after
// the previous one started can only come from that randomness.
func TestFollowersPollAtRandomIntervals(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		var mu sync.Mutex
		var starts []time.Time
		a := start(t, tg, "a")
		start(t, tg, "b", func(c *cluster.Config) {
			c.Observer = func(o cluster.Operation) {
				if o.Kind == cluster.OpAcquire {
					mu.Lock()
					starts = append(starts, time.Now().Add(-o.Duration))
					mu.Unlock()
				}
			}
		})
		if !a.IsLeader() {
			t.Fatal("a does not lead")
		}
		const gaps = 30
		waitFor(t, 3*gaps*testdb.Heartbeat, "b's attempts", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(starts) > gaps+1
		})
		mu.Lock()
		defer mu.Unlock()
		var short int
		lo, hi := time.Hour, time.Duration(0)
		for i := 2; i <= gaps+1; i++ { // the first attempt is New's
			gap := starts[i].Sub(starts[i-1])
			lo, hi = min(lo, gap), max(hi, gap)
			if gap < testdb.Heartbeat {
				short++
			}
			if gap < testdb.Heartbeat*4/5-5*time.Millisecond {
				t.Errorf("b tried %v after its previous attempt began, under 80%% of the heartbeat (%v)", gap, testdb.Heartbeat)
			}
		}
		t.Logf("%d gaps between b's attempts, %v to %v, %d under one heartbeat", gaps, lo, hi, short)
		if short == 0 {
			t.Errorf("all %d gaps between b's attempts were a heartbeat (%v) or more: it polls in step with the heartbeat", gaps, testdb.Heartbeat)
		}
	})
}
