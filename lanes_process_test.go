//go:build unix

package cluster_test

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// envLanes lists, comma-separated, the lanes a child node process works
// on, as a partitioned consumer does: it goes round the lanes it owns,
// writing one row to each lane's log in a transaction that begins with
// ClaimLane, tries the others every tenth round, and reports
// "lane-claimed <key> <token>" whenever it claims a lane anew.
const envLanes = "CLUSTER_TEST_CHILD_LANES"

// childLanes starts the child's lane worker, when envLanes is set; it
// stops when done closes.
func childLanes(ctx context.Context, c *cluster.Cluster, db *sql.DB, d cluster.Dialect, prefix string,
	say func(string, ...any), done <-chan struct{}, wg *sync.WaitGroup) {
	keys := os.Getenv(envLanes)
	if keys == "" {
		return
	}
	wg.Go(func() {
		tokens := map[string]uint64{}
		for round := 0; ; round++ {
			for _, k := range strings.Split(keys, ",") {
				select {
				case <-done:
					return
				default:
				}
				if round%10 != 0 && !c.OwnsLane(k) {
					continue
				}
				token, err := laneWriteOn(ctx, c, db, d, prefix, k)
				switch {
				case err == nil && token != tokens[k]:
					tokens[k] = token
					say("lane-claimed %s %d", k, token)
				case err != nil && !expectedLaneRefusal(err):
					say("lane-error %s %v", k, err)
				}
			}
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
}

// Lane owners in separate processes: a process that owns a lane is killed
// with SIGKILL (it neither renews nor releases), and another process
// claims the lane once it expires by the database clock, with the next
// token; every lane's writes, from all the processes, commit in token
// order, one process per token.
func TestMultiProcessLanes(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		setup := tg.Open(t)
		createWriteLog(t, tg, setup)
		createLaneLog(t, tg, setup)
		lanes := envLanes + "=k1,k2"
		a := spawn(t, tg, "a", lanes)
		m := mark(a)
		await(t, 20*time.Second, "lane-claimed k1", m)
		await(t, 20*time.Second, "lane-claimed k2", m)
		b := spawn(t, tg, "b", lanes)
		// b takes its share: a hands one lane over (⌈2 lanes / 2 members⌉)
		// and keeps the other.
		_, line := await(t, 20*time.Second, "lane-claimed", mark(b))
		taken := strings.Fields(line)[1]

		// Kill a, which owns the other lane; b claims it once it expired.
		m = mark(b)
		a.signal(t, syscall.SIGKILL)
		killed := time.Now()
		var took time.Duration
		var claim string
		waitFor(t, 15*time.Second, "b to claim the killed process's lane", func() bool {
			for _, l := range b.output()[m[b]:] {
				if f := strings.Fields(l); len(f) == 3 && f[0] == "lane-claimed" && f[1] != taken {
					claim, took = l, time.Since(killed)
					return true
				}
			}
			return false
		})
		t.Logf("b: %q %v after a was killed (LeaseTTL 1s)", claim, took.Round(time.Millisecond))
		// a's keeper renewed the lane at most a heartbeat before the kill.
		if took < 800*time.Millisecond {
			t.Errorf("the lane was claimed %v after its owner was killed, before it could expire", took)
		}
		if f := strings.Fields(claim); f[2] == "1" {
			t.Errorf("b claimed a's lane with token 1: the token went back")
		}

		b.signal(t, syscall.SIGTERM)
		select {
		case err := <-b.exit:
			b.exit <- err
			if err != nil {
				t.Errorf("b exited: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("b did not exit on SIGTERM")
		}
		if _, ok := b.has("bye"); !ok {
			t.Error("b did not shut down cleanly")
		}
		for _, ch := range []*child{a, b} {
			if l, ok := ch.has("lane-error"); ok {
				t.Errorf("%s: %s", ch.id, l)
			}
		}
		byLane := map[string]map[string]bool{}
		for lane, log := range readLaneLog(t, tg, setup) { // token order on every lane
			byLane[lane] = map[string]bool{}
			for _, e := range log {
				byLane[lane][e.node] = true
			}
		}
		t.Logf("writers of each lane: %v", byLane)
		for _, k := range []string{"k1", "k2"} {
			if k != taken && !(byLane[k]["a"] && byLane[k]["b"]) {
				t.Fatalf("lane %s was not written by a and then b: %v", k, byLane)
			}
		}
	})
}
