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
			c.LeaseTTL, c.HeartbeatInterval, c.FenceTimeout = 15*time.Second, 5*time.Second, 10*time.Second
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
		<-attempts // b just tried: its next poll is a heartbeat (5s) away
		if err := a.Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
		// Well before b's next poll, with room for a loaded machine.
		took := waitFor(t, 3*time.Second, "b to take over when a resigned", b.IsLeader)
		t.Logf("b led %v after a resigned (its next poll was up to 5s away)", took.Round(time.Millisecond))
	})
}

// A PostgreSQL release commits with synchronous_commit off for its own
// transaction only: the connection it ran on goes back to the pool with
// the server's setting, so the application's commits on it stay durable.
func TestReleaseLeavesSynchronousCommitAlone(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	db := tg.Open(t)
	db.SetMaxOpenConns(1) // the release and the check below share the connection
	var before string
	if err := db.QueryRowContext(ctx, "SHOW synchronous_commit").Scan(&before); err != nil {
		t.Fatal(err)
	}
	a := startOn(t, tg, db, "a")
	if !a.IsLeader() {
		t.Fatal("a does not lead")
	}
	if err := a.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := cluster.NewDBProvider(db, tg.Dialect, tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := p.Leader(ctx, "leader"); err != nil || l != nil {
		t.Fatalf("after Shutdown the lease is held by %+v (%v); want it released", l, err)
	}
	var after string
	if err := db.QueryRowContext(ctx, "SHOW synchronous_commit").Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Fatalf("synchronous_commit on the release's connection is %q after the release, %q before", after, before)
	}
}
