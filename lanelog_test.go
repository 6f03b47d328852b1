package cluster_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// Helpers of the lane tests: claims in a transaction of their own, the
// per-lane write log (laneWrite mirrors fencedWrite, one sequence per
// lane), and a watcher of lane ownership.

// claimLane claims key for n in a transaction of its own, committed.
func claimLane(ctx context.Context, n *node, key string) (uint64, error) {
	tx, err := n.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	token, err := n.ClaimLane(ctx, tx, key)
	if err != nil {
		return 0, err
	}
	return token, tx.Commit()
}

// createLaneLog creates <prefix>lane_seq, a counter per lane, and
// <prefix>lane_writes, where laneWrite appends (lane, seq, token, node).
func createLaneLog(t *testing.T, tg testdb.Target, db *sql.DB) {
	t.Helper()
	for _, q := range []string{
		"CREATE TABLE " + tg.Prefix + "lane_seq (lane VARCHAR(64) PRIMARY KEY, n BIGINT NOT NULL)",
		"CREATE TABLE " + tg.Prefix + "lane_writes (lane VARCHAR(64) NOT NULL, seq BIGINT NOT NULL, token BIGINT NOT NULL, node VARCHAR(16) NOT NULL, PRIMARY KEY (lane, seq))",
	} {
		if _, err := db.ExecContext(context.Background(), q); err != nil {
			t.Fatal(err)
		}
	}
}

// laneWrite appends one row to lane key's log in a transaction that
// begins with ClaimLane: the row's seq comes from the lane's counter,
// read after the claim, so seq order is the lane's commit order; its
// token is the one the claim returned.
func laneWrite(ctx context.Context, n *node, d cluster.Dialect, prefix, key string) (uint64, error) {
	return laneWriteOn(ctx, n.Cluster, n.db, d, prefix, key)
}

// laneWriteOn is laneWrite for a member c writing through db.
func laneWriteOn(ctx context.Context, c *cluster.Cluster, db *sql.DB, d cluster.Dialect, prefix, key string) (uint64, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	token, err := c.ClaimLane(ctx, tx, key)
	if err != nil {
		return 0, err
	}
	var s int64
	err = tx.QueryRowContext(ctx, bind(d, "SELECT n FROM "+prefix+"lane_seq WHERE lane = ?"), key).Scan(&s)
	switch {
	case err == sql.ErrNoRows:
		if _, err := tx.ExecContext(ctx, bind(d, "INSERT INTO "+prefix+"lane_seq (lane, n) VALUES (?, 0)"), key); err != nil {
			return 0, err
		}
	case err != nil:
		return 0, err
	}
	s++
	if _, err := tx.ExecContext(ctx, bind(d, "UPDATE "+prefix+"lane_seq SET n = ? WHERE lane = ?"), s, key); err != nil {
		return 0, err
	}
	if _, err := tx.ExecContext(ctx, bind(d, "INSERT INTO "+prefix+"lane_writes (lane, seq, token, node) VALUES (?, ?, ?, ?)"), key, s, token, c.NodeID()); err != nil {
		return 0, err
	}
	return token, tx.Commit()
}

// laneEntry is a row of a lane's log.
type laneEntry struct {
	seq, token int64
	node       string
}

// readLaneLog returns each lane's log in commit order, failing the test
// if a lane's token ever decreases along it, or if one token of a lane
// was written by two nodes.
func readLaneLog(t *testing.T, tg testdb.Target, db *sql.DB) map[string][]laneEntry {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), "SELECT lane, seq, token, node FROM "+tg.Prefix+"lane_writes ORDER BY lane, seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string][]laneEntry{}
	owner := map[string]string{} // lane/token -> node
	for rows.Next() {
		var lane string
		var e laneEntry
		if err := rows.Scan(&lane, &e.seq, &e.token, &e.node); err != nil {
			t.Fatal(err)
		}
		log := out[lane]
		if n := len(log); n > 0 && e.token < log[n-1].token {
			t.Fatalf("lane %s: commit %d by %s has token %d after commit %d with token %d", lane, e.seq, e.node, e.token, log[n-1].seq, log[n-1].token)
		}
		id := fmt.Sprintf("%s/%d", lane, e.token)
		if o, ok := owner[id]; ok && o != e.node {
			t.Fatalf("lane %s: token %d written by %s and %s", lane, e.token, o, e.node)
		}
		owner[id] = e.node
		out[lane] = append(log, e)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// watchLaneOwners samples OwnsLane on every node for every key until the
// test ends, and fails it if two nodes own one lane at the same instant
// (both seen owning it in two consecutive passes).
func watchLaneOwners(t *testing.T, keys []string, nodes ...*node) {
	t.Helper()
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		first := make([][]bool, len(nodes))
		for i := range first {
			first[i] = make([]bool, len(keys))
		}
		for !stop.Load() {
			for i, n := range nodes {
				for j, k := range keys {
					first[i][j] = n.OwnsLane(k)
				}
			}
			for j, k := range keys {
				var owners []string
				for i, n := range nodes {
					if first[i][j] && n.OwnsLane(k) {
						owners = append(owners, n.NodeID())
					}
				}
				if len(owners) > 1 {
					t.Errorf("lane %s owned by %v at once", k, owners)
					return
				}
			}
			time.Sleep(200 * time.Microsecond)
		}
	}()
	t.Cleanup(func() {
		stop.Store(true)
		<-done
	})
}

// laneWorker writes to the keys it owns, in a loop, and tries the others
// every fourth round, until stopped: what a partitioned consumer does,
// polling its own keys (OwnsLane) and looking for free ones now and then.
// Refused claims are expected.
type laneWorker struct {
	stop  chan struct{}
	done  sync.WaitGroup
	mu    sync.Mutex
	wrote map[string]int
	errs  []error
}

func startLaneWorker(t *testing.T, tg testdb.Target, n *node, keys []string, pause time.Duration) *laneWorker {
	t.Helper()
	w := &laneWorker{stop: make(chan struct{}), wrote: map[string]int{}}
	w.done.Go(func() {
		ctx := context.Background()
		for round := 0; ; round++ {
			for _, k := range keys {
				select {
				case <-w.stop:
					return
				default:
				}
				if round%4 != 0 && !n.OwnsLane(k) {
					continue
				}
				_, err := laneWrite(ctx, n, tg.Dialect, tg.Prefix, k)
				w.mu.Lock()
				switch {
				case err == nil:
					w.wrote[k]++
				case expectedLaneRefusal(err):
				default:
					w.errs = append(w.errs, err)
				}
				w.mu.Unlock()
				if err == nil {
					// Leave SQLite's write lock to the others a moment, as a
					// worker doing real work between transactions would.
					time.Sleep(5 * time.Millisecond)
				}
			}
			select {
			case <-w.stop:
				return
			case <-time.After(pause):
			}
		}
	})
	t.Cleanup(w.halt)
	return w
}

// halt stops the worker and waits for it; it may be called again.
func (w *laneWorker) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.done.Wait()
}

// unexpected returns the errors other than refused claims.
func (w *laneWorker) unexpected() []error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.errs)
}

// lanesOf returns how many of keys each node owns.
func lanesOf(keys []string, nodes ...*node) []int {
	out := make([]int, len(nodes))
	for i, n := range nodes {
		for _, k := range keys {
			if n.OwnsLane(k) {
				out[i]++
			}
		}
	}
	return out
}
