// Command lanes shows partitioned work with lanes: three nodes in one
// process share four partitions of a queue (one lane each) in an embedded
// SQLite database, and each node's worker processes only the partitions
// it owns, one item per transaction, in order. One node shuts down: its
// lanes are released and taken at once; another crashes: its lanes expire
// and the last node takes them over. The summary proves that every
// partition's items were processed once each, in order, under tokens
// that never went back. It finishes on its own:
//
//	go run ./examples/lanes
//
// Each node runs WorkLanes, which claims the partitions it may own and
// runs a function per owned partition. Each of that function's
// transactions begins with ClaimLane: it renews this node's claim and
// holds it until the transaction ends, so a node that lost the partition
// cannot process its next item.
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	_ "modernc.org/sqlite"

	"github.com/sqlfence/cluster"
)

// Short timings so the demo is quick; production defaults are 30s/10s.
const (
	leaseTTL  = time.Second
	heartbeat = 200 * time.Millisecond
	itemsPer  = 30
)

var partitions = []string{"orders-0", "orders-1", "orders-2", "orders-3"}

var epoch = time.Now()

// worked holds the partitions a node's function runs for now.
var worked sync.Map

func say(format string, args ...any) {
	fmt.Printf("  [%4.2fs] "+format+"\n", append([]any{time.Since(epoch).Seconds()}, args...)...)
}

type node struct {
	*cluster.Cluster
	lease *sql.DB // the cluster's pool
	app   *sql.DB // the worker's pool
	stop  context.CancelFunc
	done  sync.WaitGroup
}

func main() {
	log.SetFlags(0)
	dir, err := os.MkdirTemp("", "cluster-lanes-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	// _txlock=immediate: a worker's transaction takes SQLite's write lock
	// when it begins, so its claim holds from the first statement.
	dsn := "file:" + filepath.Join(dir, "queue.db") + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate"
	ctx := context.Background()

	setup := open(dsn)
	for _, q := range []string{
		`CREATE TABLE items (partition TEXT NOT NULL, seq INTEGER NOT NULL, done_by TEXT, PRIMARY KEY (partition, seq))`,
		`CREATE TABLE processed (id INTEGER PRIMARY KEY AUTOINCREMENT, partition TEXT NOT NULL, seq INTEGER NOT NULL,
			node TEXT NOT NULL, fencing_token INTEGER NOT NULL)`,
	} {
		if _, err := setup.ExecContext(ctx, q); err != nil {
			log.Fatal(err)
		}
	}
	for _, p := range partitions {
		for seq := 1; seq <= itemsPer; seq++ {
			if _, err := setup.ExecContext(ctx, `INSERT INTO items (partition, seq) VALUES (?, ?)`, p, seq); err != nil {
				log.Fatal(err)
			}
		}
	}

	fmt.Printf("Three nodes share %d partitions of %d items each; each processes only the partitions it owns.\n", len(partitions), itemsPer)
	var nodes []*node
	for _, id := range []string{"node-1", "node-2", "node-3"} {
		n := &node{lease: open(dsn), app: open(dsn)}
		n.Cluster, err = cluster.New(ctx, cluster.Config{
			NodeID:            id,
			DB:                n.lease,
			LeaseTTL:          leaseTTL,
			HeartbeatInterval: heartbeat,
			// The crashed node's failures are expected; keep the output
			// to the story.
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			log.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	for _, n := range nodes {
		wctx, stop := context.WithCancel(ctx)
		n.stop = stop
		n.done.Go(func() { n.work(wctx) })
	}
	waitFor(func() bool {
		for _, p := range partitions {
			if _, ok := worked.Load(p); !ok {
				return false
			}
		}
		return true
	})
	fmt.Printf("The partitions spread within one of even: %s %v, %s %v, %s %v.\n",
		nodes[0].NodeID(), nodes[0].Lanes(), nodes[1].NodeID(), nodes[1].Lanes(), nodes[2].NodeID(), nodes[2].Lanes())
	waitFor(func() bool { return processed(setup) >= int64(len(partitions)*itemsPer/4) })

	leaving := busiest(nodes)
	released := leaving.Lanes()
	fmt.Printf("\n%s shuts down gracefully: Shutdown stops its work on %v, waits for it, then releases them.\n", leaving.NodeID(), released)
	start := time.Now()
	if err := leaving.Shutdown(ctx); err != nil {
		log.Fatal(err)
	}
	leaving.done.Wait()
	rest := without(nodes, leaving)
	waitFor(func() bool { return ownedBy(rest, released) })
	fmt.Printf("The others own %v %v after the release.\n", released, time.Since(start).Round(10*time.Millisecond))

	waitFor(func() bool { return processed(setup) >= int64(len(partitions)*itemsPer/2) })
	crashed := busiest(rest)
	orphans := crashed.Lanes()
	fmt.Printf("\n%s crashes while it owns %v: its pools close, so it neither renews nor releases them.\n",
		crashed.NodeID(), orphans)
	crashed.app.Close()
	crashed.lease.Close()
	crash := time.Now()
	crashed.stop()
	crashed.done.Wait()
	last := without(rest, crashed)[0]
	waitFor(func() bool { return ownedBy([]*node{last}, orphans) })
	fmt.Printf("%s owns %v %v after the crash: they expired by the database clock (LeaseTTL %v),\n"+
		"and %s dropped out of the fair share a heartbeat later.\n",
		last.NodeID(), orphans, time.Since(crash).Round(10*time.Millisecond), leaseTTL, crashed.NodeID())

	waitFor(func() bool { return processed(setup) == int64(len(partitions)*itemsPer) })
	last.stop()
	last.done.Wait()
	last.Shutdown(ctx)
	crashed.Shutdown(ctx) // its pool is closed: it can release nothing
	leaving.app.Close()
	leaving.lease.Close()
	last.app.Close()
	last.lease.Close()

	fmt.Printf("\nSummary, per partition, in commit order:\n")
	if !summary(ctx, setup) {
		setup.Close()
		os.Exit(1)
	}
	setup.Close()
	fmt.Println("Every item was processed once, in order per partition, and no partition's token ever went back.")
}

// work is a node's worker: WorkLanes claims the partitions this node may
// own, spread over the nodes to within one of even, and runs a function
// per owned partition until it is lost, handed over, or the node stops
// (ctx, or Shutdown).
func (n *node) work(ctx context.Context) {
	n.WorkLanes(ctx, partitions, func(ctx context.Context, p string, token uint64) error {
		say("%s works on %s (fencing token %d)", n.NodeID(), p, token)
		worked.Store(p, n.NodeID())
		defer worked.Delete(p)
		for ctx.Err() == nil {
			did, err := n.processNext(ctx, p)
			switch {
			case errors.Is(err, cluster.ErrLaneHeld), errors.Is(err, cluster.ErrLaneLimit):
				return nil // no longer this node's: the claim refused it
			case err != nil:
				return err
			}
			wait := 20 * time.Millisecond // nothing to do: look again soon
			if did {
				wait = 5 * time.Millisecond // the work, done outside the transaction
			}
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
		}
		return nil
	})
}

// processNext records partition p's next item as processed, in one
// transaction that begins with ClaimLane, and reports whether there was
// one. (On SQLite a transaction holds the database's one write lock, so
// it stays short: the work itself happens between transactions.)
func (n *node) processNext(ctx context.Context, p string) (bool, error) {
	tx, err := n.app.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	token, err := n.ClaimLane(ctx, tx, p) // first, in every transaction
	if err != nil {
		return false, err
	}
	var seq int64
	err = tx.QueryRowContext(ctx, `SELECT seq FROM items WHERE partition = ? AND done_by IS NULL ORDER BY seq LIMIT 1`, p).Scan(&seq)
	if errors.Is(err, sql.ErrNoRows) {
		return false, tx.Commit()
	}
	if err != nil {
		return false, err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE items SET done_by = ? WHERE partition = ? AND seq = ?`, n.NodeID(), p, seq); err != nil {
		return false, err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO processed (partition, seq, node, fencing_token) VALUES (?, ?, ?, ?)`,
		p, seq, n.NodeID(), token); err != nil {
		return false, err
	}
	return true, tx.Commit()
}

// summary prints each partition's processing in commit order, by node and
// token, and reports whether every partition's items were processed once
// each, in sequence, under tokens that never went back.
func summary(ctx context.Context, db *sql.DB) bool {
	ok := true
	for _, p := range partitions {
		rows, err := db.QueryContext(ctx, `SELECT seq, node, fencing_token FROM processed WHERE partition = ? ORDER BY id`, p)
		if err != nil {
			log.Fatal(err)
		}
		type run struct {
			node        string
			token       int64
			first, last int64
		}
		var runs []run
		var next int64 = 1
		for rows.Next() {
			var seq, token int64
			var node string
			if err := rows.Scan(&seq, &node, &token); err != nil {
				log.Fatal(err)
			}
			if seq != next {
				fmt.Printf("  %s: item %d processed where %d was next\n", p, seq, next)
				ok = false
			}
			next = seq + 1
			if n := len(runs); n > 0 && token < runs[n-1].token {
				fmt.Printf("  %s: token %d after token %d\n", p, token, runs[n-1].token)
				ok = false
			}
			if n := len(runs); n > 0 && runs[n-1].node == node && runs[n-1].token == token {
				runs[n-1].last = seq
			} else {
				runs = append(runs, run{node, token, seq, seq})
			}
		}
		rows.Close()
		if next != itemsPer+1 {
			fmt.Printf("  %s: %d of %d items processed\n", p, next-1, itemsPer)
			ok = false
		}
		line := fmt.Sprintf("  %s: items 1-%d in order:", p, next-1)
		for i, r := range runs {
			if i > 0 {
				line += ","
			}
			line += fmt.Sprintf(" %d-%d by %s (token %d)", r.first, r.last, r.node, r.token)
		}
		fmt.Println(line)
	}
	return ok
}

// busiest returns the node that owns the most lanes.
func busiest(nodes []*node) *node {
	b := nodes[0]
	for _, n := range nodes[1:] {
		if len(n.Lanes()) > len(b.Lanes()) {
			b = n
		}
	}
	return b
}

func without(nodes []*node, drop *node) []*node {
	var out []*node
	for _, n := range nodes {
		if n != drop {
			out = append(out, n)
		}
	}
	return out
}

// ownedBy reports whether every lane in lanes is owned by one of nodes.
func ownedBy(nodes []*node, lanes []string) bool {
	for _, l := range lanes {
		owned := false
		for _, n := range nodes {
			owned = owned || n.OwnsLane(l)
		}
		if !owned {
			return false
		}
	}
	return true
}

func processed(db *sql.DB) int64 {
	var n int64
	if err := db.QueryRow(`SELECT COUNT(*) FROM processed`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	return n
}

func waitFor(cond func() bool) {
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			log.Fatal("lanes: timed out")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func open(dsn string) *sql.DB {
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		log.Fatal(err)
	}
	return db
}
