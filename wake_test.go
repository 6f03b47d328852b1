package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// Several nodes in one process on one database hand off without waiting
// for a poll: a release wakes the others at once, through any pools.
func TestInProcessWakeUp(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		slow := func(c *cluster.Config) {
			c.LeaseTTL, c.HeartbeatInterval, c.FenceTimeout = 6*time.Second, 2*time.Second, 4*time.Second
		}
		a := start(t, tg, "a", slow)
		attempts := make(chan struct{}, 16)
		b := start(t, tg, "b", slow, func(c *cluster.Config) {
			c.Observer = func(o cluster.Operation) {
				if o.Kind == cluster.OpAcquire && o.Outcome == cluster.OutcomeHeld {
					select {
					case attempts <- struct{}{}:
					default:
					}
				}
			}
		})
		if !a.IsLeader() {
			t.Fatal("a does not lead")
		}
		<-attempts // b just tried: its next poll is a heartbeat (2s) away
		if err := a.Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
		took := waitFor(t, time.Second, "b to take over when a resigned", b.IsLeader)
		t.Logf("b led %v after a resigned (its next poll was up to 2s away)", took.Round(time.Millisecond))
	})
}
