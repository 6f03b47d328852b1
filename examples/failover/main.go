// Command failover shows leader election, a graceful handoff, a stalled
// leader's write refused by the database, and a takeover after the stall,
// with three nodes in one process sharing an embedded SQLite database in a
// temporary directory. It finishes on its own:
//
//	go run ./examples/failover
//
// Each node opens its own connection pools, as separate processes would:
// one for the cluster's heartbeat and one for the application's writes.
package main

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite"

	"github.com/sqlfence/cluster"
)

// Short timings so the demo is quick; production defaults are 30s/10s.
const (
	leaseTTL  = 2 * time.Second
	heartbeat = 200 * time.Millisecond
)

type node struct {
	*cluster.Cluster
	lease *sql.DB // the cluster's pool
	app   *sql.DB // the application's pool
}

func main() {
	log.SetFlags(0)
	dir, err := os.MkdirTemp("", "cluster-failover-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	// busy_timeout lets nodes wait for each other's writes; WAL lets them
	// read while one writes; _txlock=immediate makes a write transaction
	// take SQLite's write lock when it begins.
	dsn := "file:" + filepath.Join(dir, "cluster.db") + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate"
	ctx := context.Background()
	epoch := time.Now()

	// The application's hash-chained audit log, whose tip the cluster guards.
	setup := open(dsn)
	if _, err := setup.ExecContext(ctx, `CREATE TABLE audit (
		monotonic_counter INTEGER PRIMARY KEY,
		row_hash BLOB NOT NULL,
		event TEXT NOT NULL,
		fencing_token INTEGER NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	setup.Close()

	// The nodes' transitions arrive on one channel, printed as they come;
	// the Cluster never blocks sending, so the channel has a buffer.
	events := make(chan cluster.Event, 64)
	go func() {
		for e := range events {
			if e.Kind == cluster.EventLeaderChanged {
				continue // each node's own transitions tell the story
			}
			reason := ""
			if e.Reason != "" {
				reason = " (" + string(e.Reason) + ")"
			}
			fmt.Printf("  [%5.2fs] %s: %s, fencing token %d%s\n", e.At.Sub(epoch).Seconds(), e.NodeID, e.Kind, e.FencingToken, reason)
		}
	}()

	var nodes []*node
	for _, id := range []string{"node-1", "node-2", "node-3"} {
		n := &node{lease: open(dsn), app: open(dsn)}
		defer n.lease.Close()
		defer n.app.Close()
		n.Cluster, err = cluster.New(ctx, cluster.Config{
			NodeID:            id,
			DB:                n.lease,
			LeaseTTL:          leaseTTL,
			HeartbeatInterval: heartbeat,
			Endpoint:          "https://" + id + ".example.internal:8443",
			Chains:            []cluster.Chain{{Name: "audit", Table: "audit"}},
			Events:            events,
		})
		if err != nil {
			log.Fatal(err)
		}
		nodes = append(nodes, n)
	}

	fmt.Println("Three nodes started.")
	first := waitForLeader(nodes)
	report(ctx, first, nodes)
	if err := first.appendAudit(ctx, "node-1 was elected"); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s wrote audit row 1 under fencing token %d.\n", first.NodeID(), first.FencingToken())

	fmt.Printf("\n%s shuts down gracefully and releases the lease.\n", first.NodeID())
	start := time.Now()
	if err := first.Shutdown(ctx); err != nil {
		log.Fatal(err)
	}
	rest := without(nodes, first)
	second := waitForLeader(rest)
	fmt.Printf("%s took over %v after the release, at its next poll: each node here has a pool, and so a provider, of its own, and a follower polls once per heartbeat (%v). Nodes sharing one provider, or listening on PostgreSQL through clusterpgx, take over within milliseconds.\n",
		second.NodeID(), time.Since(start).Round(time.Millisecond), heartbeat)
	report(ctx, second, rest)

	// A request handler on the leader reads its token, then stalls (a long
	// GC pause, a frozen VM). We stand in for the stall by cutting the
	// node's heartbeat, so its lease runs out while the handler waits.
	staleToken := second.FencingToken()
	fmt.Printf("\n%s stalls in the middle of a write under fencing token %d: its heartbeat stops\n"+
		"and it never releases the lease, as if it had crashed.\n", second.NodeID(), staleToken)
	start = time.Now()
	second.lease.Close()
	rest = without(rest, second)
	third := waitForLeader(rest)
	fmt.Printf("%s took over %v later, once the lease (TTL %v) expired; its fencing token is %d.\n",
		third.NodeID(), time.Since(start).Round(10*time.Millisecond), leaseTTL, third.FencingToken())
	fmt.Printf("%s stopped believing it leads before its lease expired: IsLeader=%v.\n", second.NodeID(), second.IsLeader())

	// The stalled handler resumes and writes with the token it read before
	// the stall. The database refuses it: the token is not the lease's.
	err = writeAuditRaw(ctx, second.app, 2, "written by a stale leader", staleToken)
	fmt.Printf("%s's late write under token %d: %v\n", second.NodeID(), staleToken, err)
	if err := third.appendAudit(ctx, "node-3 took over"); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s wrote audit row 2 under fencing token %d.\n", third.NodeID(), third.FencingToken())
	report(ctx, third, rest)

	fmt.Println("\nShutting down.")
	second.Shutdown(ctx) // its release fails: its heartbeat pool is gone
	if err := third.Shutdown(ctx); err != nil {
		log.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // let the last events print
}

func open(dsn string) *sql.DB {
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		log.Fatal(err)
	}
	return db
}

// appendAudit appends an event to the audit chain in one fenced transaction:
// Fence checks the term in the database and holds it until commit, and
// AdvanceTip records the new tip under the same token.
func (n *node) appendAudit(ctx context.Context, event string) error {
	tx, err := n.app.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	token, err := n.Fence(ctx, tx)
	if err != nil {
		return err
	}
	var last int64
	var prev []byte
	err = tx.QueryRowContext(ctx, "SELECT monotonic_counter, row_hash FROM audit ORDER BY monotonic_counter DESC LIMIT 1").Scan(&last, &prev)
	if err != nil && err != sql.ErrNoRows {
		return err
	}
	counter := last + 1
	hash := chainHash(prev, counter, event)
	if _, err := tx.ExecContext(ctx, "INSERT INTO audit (monotonic_counter, row_hash, event, fencing_token) VALUES (?, ?, ?, ?)",
		counter, hash, event, token); err != nil {
		return err
	}
	if err := n.AdvanceTip(ctx, tx, "audit", uint64(counter), hash); err != nil {
		return err
	}
	return tx.Commit()
}

// writeAuditRaw is what a stalled process does when it resumes: it writes
// the row and the tip with the token it read before the stall, without
// asking anyone. The tip table's trigger decides.
func writeAuditRaw(ctx context.Context, db *sql.DB, counter int64, event string, token uint64) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	hash := chainHash(nil, counter, event)
	if _, err := tx.ExecContext(ctx, "INSERT INTO audit (monotonic_counter, row_hash, event, fencing_token) VALUES (?, ?, ?, ?)",
		counter, hash, event, token); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "UPDATE cluster_chain_tips SET at_counter = ?, row_hash = ?, fencing_token = ? WHERE scope = 'audit'",
		counter, hash, token); err != nil {
		return fmt.Errorf("refused by the database: %w", err)
	}
	return tx.Commit()
}

func chainHash(prev []byte, counter int64, event string) []byte {
	h := sha256.New()
	h.Write(prev)
	fmt.Fprintf(h, "%d:%s", counter, event)
	return h.Sum(nil)
}

// waitForLeader polls until one of nodes leads.
func waitForLeader(nodes []*node) *node {
	deadline := time.Now().Add(4 * leaseTTL)
	for time.Now().Before(deadline) {
		for _, n := range nodes {
			if n.IsLeader() {
				return n
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	log.Fatal("no leader elected")
	return nil
}

// report prints who leads as each node sees it.
func report(ctx context.Context, leader *node, nodes []*node) {
	fmt.Printf("%s leads with fencing token %d.\n", leader.NodeID(), leader.FencingToken())
	for _, n := range nodes {
		l, err := n.CurrentLeader(ctx)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("  %s: IsLeader=%-5v sees leader %s at %s\n", n.NodeID(), n.IsLeader(), l.NodeID, l.Endpoint)
	}
}

func without(nodes []*node, gone *node) []*node {
	var out []*node
	for _, n := range nodes {
		if n != gone {
			out = append(out, n)
		}
	}
	return out
}
