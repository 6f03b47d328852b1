// Command failover shows leader election, a graceful handoff and a crash
// takeover with three nodes in one process, sharing an embedded SQLite
// database in a temporary directory. It finishes on its own:
//
//	go run ./examples/failover
//
// Each node opens its own connection pool, as separate processes would.
package main

import (
	"context"
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
	db *sql.DB
}

func main() {
	log.SetFlags(0)
	dir, err := os.MkdirTemp("", "cluster-failover-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	// busy_timeout lets nodes wait for each other's writes; WAL lets them
	// read while one writes.
	dsn := "file:" + filepath.Join(dir, "cluster.db") + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)"
	ctx := context.Background()
	epoch := time.Now()

	var nodes []*node
	for _, id := range []string{"node-1", "node-2", "node-3"} {
		db, err := sql.Open("sqlite", dsn)
		if err != nil {
			log.Fatal(err)
		}
		defer db.Close()
		c, err := cluster.New(ctx, cluster.Config{
			NodeID:            id,
			DB:                db,
			LeaseTTL:          leaseTTL,
			HeartbeatInterval: heartbeat,
			Endpoint:          "https://" + id + ".example.internal:8443",
			OnTransition: func(e cluster.Event) {
				reason := ""
				if e.Reason != "" {
					reason = " (" + e.Reason + ")"
				}
				fmt.Printf("  [%5.2fs] %s: %s, fencing token %d%s\n", time.Since(epoch).Seconds(), e.NodeID, e.Kind, e.FencingToken, reason)
			},
		})
		if err != nil {
			log.Fatal(err)
		}
		nodes = append(nodes, &node{Cluster: c, db: db})
	}

	fmt.Println("Three nodes started.")
	first := waitForLeader(nodes)
	report(ctx, first, nodes)

	fmt.Printf("\n%s shuts down gracefully and releases the lease.\n", first.NodeID())
	start := time.Now()
	if err := first.Shutdown(ctx); err != nil {
		log.Fatal(err)
	}
	rest := without(nodes, first)
	second := waitForLeader(rest)
	fmt.Printf("%s took over %v after the release (followers poll every %v).\n",
		second.NodeID(), time.Since(start).Round(10*time.Millisecond), heartbeat)
	report(ctx, second, rest)

	fmt.Printf("\n%s crashes: it loses its database and never releases the lease.\n", second.NodeID())
	start = time.Now()
	second.db.Close()
	rest = without(rest, second)
	third := waitForLeader(rest)
	fmt.Printf("%s took over %v after the crash, once the lease (TTL %v) expired.\n",
		third.NodeID(), time.Since(start).Round(10*time.Millisecond), leaseTTL)
	fmt.Printf("%s stopped believing it leads before its lease expired (IsLeader=%v);\n"+
		"%s's fencing token %d is above every token issued before.\n",
		second.NodeID(), second.IsLeader(), third.NodeID(), third.FencingToken())
	report(ctx, third, rest)

	fmt.Println("\nShutting down.")
	second.Shutdown(ctx) // its release fails: its database is gone
	if err := third.Shutdown(ctx); err != nil {
		log.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // let the last events print
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
