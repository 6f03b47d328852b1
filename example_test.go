package cluster_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"time"

	_ "modernc.org/sqlite"

	"github.com/sqlfence/cluster"
)

// openExampleDB opens an embedded SQLite database in a fresh directory.
func openExampleDB() (*sql.DB, func()) {
	dir, err := os.MkdirTemp("", "cluster-example-")
	if err != nil {
		log.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "cluster.db")+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
	if err != nil {
		log.Fatal(err)
	}
	return db, func() { db.Close(); os.RemoveAll(dir) }
}

// A node joins the cluster with New; a lone node leads when New returns.
func ExampleNew() {
	db, cleanup := openExampleDB()
	defer cleanup()
	ctx := context.Background()

	c, err := cluster.New(ctx, cluster.Config{
		NodeID:   "api-1",
		DB:       db,
		Endpoint: "https://api-1.example.internal:8443",
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Shutdown(ctx)

	fmt.Println("leader:", c.IsLeader())
	fmt.Println("fencing token:", c.FencingToken())
	// Output:
	// leader: true
	// fencing token: 1
}

// Without Init, the process is a permanent single leader and nothing
// touches a database.
func ExampleIsLeader() {
	if cluster.IsLeader() {
		fmt.Println("running the hourly job on", cluster.Default().NodeID())
	}
	// Output:
	// running the hourly job on single-node-local
}

// RequireLeader gates a write handler: a follower answers 503 so the load
// balancer retries on the leader.
func ExampleCluster_RequireLeader() {
	db, cleanup := openExampleDB()
	defer cleanup()
	ctx := context.Background()
	leader, _ := cluster.New(ctx, cluster.Config{NodeID: "api-1", DB: db})
	follower, _ := cluster.New(ctx, cluster.Config{NodeID: "api-2", DB: db})
	defer leader.Shutdown(ctx)
	defer follower.Shutdown(ctx)

	write := func(c *cluster.Cluster) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if err := c.RequireLeader(); err != nil {
				http.Error(w, "not the leader", cluster.HTTPStatus(err))
				return
			}
			w.WriteHeader(http.StatusCreated)
		}
	}
	for _, c := range []*cluster.Cluster{leader, follower} {
		rec := httptest.NewRecorder()
		write(c)(rec, httptest.NewRequest(http.MethodPost, "/orders", nil))
		fmt.Println(c.NodeID(), rec.Code)
	}
	err := follower.RequireLeader()
	fmt.Println(errors.Is(err, cluster.ErrNotLeader))
	// Output:
	// api-1 201
	// api-2 503
	// true
}

// Mount the discovery handler on the service's mux to tell load balancers
// who leads.
func ExampleCluster_DiscoveryHandler() {
	db, cleanup := openExampleDB()
	defer cleanup()
	ctx := context.Background()
	c, _ := cluster.New(ctx, cluster.Config{NodeID: "api-1", DB: db, Endpoint: "https://api-1.example.internal:8443"})
	defer c.Shutdown(ctx)

	mux := http.NewServeMux()
	mux.Handle("/cluster/leader", c.DiscoveryHandler())

	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/cluster/leader", nil))
	fmt.Println(rec.Code, rec.Header().Get("Cache-Control"))
	// Output:
	// 200 no-store
}

// Transitions arrive in order on a channel, received by a goroutine of
// the application's. The Cluster never blocks sending: give the channel a
// buffer.
func ExampleCluster_Notify() {
	db, cleanup := openExampleDB()
	defer cleanup()
	ctx := context.Background()
	events := make(chan cluster.Event, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range events {
			line := fmt.Sprintf("%s %s, token %d", e.NodeID, e.Kind, e.FencingToken)
			if e.Reason != "" {
				line += " (" + string(e.Reason) + ")"
			}
			if e.LeaderID != "" {
				line += ", leader " + e.LeaderID
			}
			fmt.Println(line)
			if e.Kind == cluster.EventLeaseReleased {
				return
			}
		}
	}()
	c, err := cluster.New(ctx, cluster.Config{NodeID: "api-1", DB: db, Events: events})
	if err != nil {
		log.Fatal(err)
	}
	c.Shutdown(ctx)
	<-done
	// Output:
	// api-1 lease-acquired, token 1
	// api-1 leader-changed, token 1, leader api-1
	// api-1 lease-released, token 1 (shutdown)
}

// CurrentLeader tells any node who leads, for forwarding a write.
func ExampleCluster_CurrentLeader() {
	db, cleanup := openExampleDB()
	defer cleanup()
	ctx := context.Background()
	leader, _ := cluster.New(ctx, cluster.Config{NodeID: "api-1", DB: db, Endpoint: "https://api-1.example.internal:8443"})
	defer leader.Shutdown(ctx)
	follower, _ := cluster.New(ctx, cluster.Config{NodeID: "api-2", DB: db, Role: cluster.RoleFollower})
	defer follower.Shutdown(ctx)

	l, err := follower.CurrentLeader(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("forward writes to", l.NodeID, "at", l.Endpoint)
	fmt.Println("lease valid for up to 30s:", time.Until(l.LeaseExpiresAt) <= 30*time.Second)
	// Output:
	// forward writes to api-1 at https://api-1.example.internal:8443
	// lease valid for up to 30s: true
}

// Fence makes the database refuse a write from a node that no longer
// holds the lease. Call it first in the transaction that writes.
func ExampleCluster_Fence() {
	db, cleanup := openExampleDB()
	defer cleanup()
	ctx := context.Background()
	c, err := cluster.New(ctx, cluster.Config{NodeID: "api-1", DB: db})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Shutdown(ctx)
	if _, err := db.ExecContext(ctx, "CREATE TABLE payments (id INTEGER PRIMARY KEY, amount INTEGER, fencing_token INTEGER)"); err != nil {
		log.Fatal(err)
	}

	pay := func(amount int) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		token, err := c.Fence(ctx, tx) // held until Commit or Rollback
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO payments (amount, fencing_token) VALUES (?, ?)", amount, token); err != nil {
			return err
		}
		return tx.Commit()
	}
	fmt.Println("while leading:", pay(100))
	c.Shutdown(ctx)
	err = pay(200)
	fmt.Println("after losing the lease:", errors.Is(err, cluster.ErrStaleFencingToken), errors.Is(err, cluster.ErrNotLeader))
	// Output:
	// while leading: <nil>
	// after losing the lease: true true
}

// BeginFenced begins a transaction and fences it in one call.
func ExampleCluster_BeginFenced() {
	db, cleanup := openExampleDB()
	defer cleanup()
	ctx := context.Background()
	c, err := cluster.New(ctx, cluster.Config{NodeID: "api-1", DB: db})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Shutdown(ctx)
	if _, err := db.ExecContext(ctx, "CREATE TABLE payments (id INTEGER PRIMARY KEY, amount INTEGER, fencing_token INTEGER)"); err != nil {
		log.Fatal(err)
	}

	pay := func(amount int) error {
		tx, token, err := c.BeginFenced(ctx, db, nil)
		if err != nil {
			return err // not the leader any more: no transaction is open
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, "INSERT INTO payments (amount, fencing_token) VALUES (?, ?)", amount, token); err != nil {
			return err
		}
		return tx.Commit()
	}
	fmt.Println("while leading:", pay(100))
	c.Shutdown(ctx)
	fmt.Println("after losing the lease:", errors.Is(pay(200), cluster.ErrStaleFencingToken))
	// Output:
	// while leading: <nil>
	// after losing the lease: true
}

// AdvanceTip records a hash-chained table's new tip in the transaction that
// appends the row; the database refuses a stale token or a tip moving
// backwards, and New refuses a database whose table fell behind its tip.
func ExampleCluster_AdvanceTip() {
	db, cleanup := openExampleDB()
	defer cleanup()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "CREATE TABLE audit (monotonic_counter INTEGER PRIMARY KEY, row_hash BLOB NOT NULL)"); err != nil {
		log.Fatal(err)
	}
	cfg := cluster.Config{
		NodeID: "api-1",
		DB:     db,
		Chains: []cluster.Chain{{Name: "audit", Table: "audit"}}, // default columns
	}
	c, err := cluster.New(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}

	appendRow := func(counter uint64, hash string) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, "INSERT INTO audit VALUES (?, ?)", counter, []byte(hash)); err != nil {
			return err
		}
		if err := c.AdvanceTip(ctx, tx, "audit", counter, []byte(hash)); err != nil {
			return err
		}
		return tx.Commit()
	}
	fmt.Println(appendRow(1, "h1"), appendRow(2, "h2"))
	c.Shutdown(ctx)

	// Someone deletes the newest row: the next node refuses to start.
	db.ExecContext(ctx, "DELETE FROM audit WHERE monotonic_counter = 2")
	cfg.NodeID = "api-2"
	_, err = cluster.New(ctx, cfg)
	fmt.Println(errors.Is(err, cluster.ErrRollbackDetected))
	// Output:
	// <nil> <nil>
	// true
}

// RunWhileLeader runs leader-only work in every term this node leads; its
// context ends with the term, and Shutdown waits for it before releasing
// the lease.
func ExampleCluster_RunWhileLeader() {
	db, cleanup := openExampleDB()
	defer cleanup()
	ctx := context.Background()
	c, err := cluster.New(ctx, cluster.Config{NodeID: "api-1", DB: db})
	if err != nil {
		log.Fatal(err)
	}
	started := make(chan struct{})
	done := make(chan error)
	go func() {
		done <- c.RunWhileLeader(ctx, func(ctx context.Context, token uint64) error {
			fmt.Println("scheduler started in term", token)
			close(started)
			<-ctx.Done() // a real scheduler would run jobs until then
			fmt.Println("scheduler stopped")
			return nil
		})
	}()
	<-started
	c.Shutdown(ctx) // cancels the term's context and waits for the scheduler
	fmt.Println("RunWhileLeader:", <-done)
	// Output:
	// scheduler started in term 1
	// scheduler stopped
	// RunWhileLeader: cluster: shut down: node "api-1"
}

// Resign hands leadership to another node without shutting down.
func ExampleCluster_Resign() {
	db, cleanup := openExampleDB()
	defer cleanup()
	ctx := context.Background()
	a, err := cluster.New(ctx, cluster.Config{NodeID: "api-1", DB: db, LeaseTTL: 3 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Shutdown(ctx)
	events := make(chan cluster.Event, 64)
	b, err := cluster.New(ctx, cluster.Config{NodeID: "api-2", DB: db, LeaseTTL: 3 * time.Second, Events: events})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Shutdown(ctx)
	fmt.Println("api-1 leads:", a.IsLeader())
	if err := a.Resign(ctx); err != nil {
		log.Fatal(err)
	}
	for e := range events {
		if e.Kind == cluster.EventLeaseAcquired {
			break
		}
	}
	fmt.Println("api-1 leads:", a.IsLeader(), "api-2 leads:", b.IsLeader())
	// Output:
	// api-1 leads: true
	// api-1 leads: false api-2 leads: true
}

// LaneOwner tells any node which node holds a lane now, to route a key's
// work to it; Clustered tells a process in single-node mode apart.
func ExampleCluster_LaneOwner() {
	db, cleanup := openExampleDB()
	defer cleanup()
	ctx := context.Background()
	a, err := cluster.New(ctx, cluster.Config{NodeID: "worker-a", DB: db})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Shutdown(ctx)
	b, err := cluster.New(ctx, cluster.Config{NodeID: "worker-b", DB: db})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Shutdown(ctx)

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := a.ClaimLane(ctx, tx, "tenant-42"); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	l, err := b.LaneOwner(ctx, "tenant-42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("tenant-42 is worked on by", l.Holder, "under lane token", l.FencingToken)
	if l, _ := b.LaneOwner(ctx, "tenant-7"); l == nil {
		fmt.Println("tenant-7 is free")
	}
	fmt.Println("clustered before Init:", cluster.Default().Clustered())
	// Output:
	// tenant-42 is worked on by worker-a under lane token 1
	// tenant-7 is free
	// clustered before Init: false
}

// Init makes the process a member of the cluster; the package-level
// functions then answer for it, and Shutdown releases its lease.
func ExampleInit() {
	db, err := sql.Open("sqlite", "file:/var/lib/app/cluster.db?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	if err := cluster.Init(ctx, cluster.Config{NodeID: "api-1", DB: db}); err != nil {
		log.Fatal(err) // a bad Config names the field, the value and the rule
	}
	defer cluster.Shutdown(ctx) // releases the lease for the next leader

	http.Handle("/cluster/leader", cluster.DiscoveryHandler())
	http.HandleFunc("/jobs/run", func(w http.ResponseWriter, r *http.Request) {
		if err := cluster.RequireLeader(); err != nil {
			http.Error(w, err.Error(), cluster.HTTPStatus(err)) // 503 on a follower
			return
		}
		fmt.Fprintln(w, "run under fencing token", cluster.FencingToken())
	})
	log.Fatal(http.ListenAndServe(":8080", nil))
}

// ClaimLane, first in a transaction, makes this node the lane's owner
// until the transaction ends and returns the lane's own fencing token;
// another node's claim is refused while the owner renews.
func ExampleCluster_ClaimLane() {
	db, cleanup := openExampleDB()
	defer cleanup()
	ctx := context.Background()
	a, err := cluster.New(ctx, cluster.Config{NodeID: "worker-a", DB: db})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Shutdown(ctx)
	b, err := cluster.New(ctx, cluster.Config{NodeID: "worker-b", DB: db})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Shutdown(ctx)

	claim := func(c *cluster.Cluster, lane string) (uint64, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return 0, err
		}
		defer tx.Rollback()
		token, err := c.ClaimLane(ctx, tx, lane)
		if err != nil {
			return 0, err
		}
		// ... the lane's writes, each carrying token ...
		return token, tx.Commit()
	}
	token, err := claim(a, "tenant-42")
	fmt.Println("worker-a:", token, err)
	_, err = claim(b, "tenant-42")
	fmt.Println("worker-b refused:", errors.Is(err, cluster.ErrLaneHeld))
	// Output:
	// worker-a: 1 <nil>
	// worker-b refused: true
}

// WorkLanes runs a function for each lane this node owns, with a context
// that ends when the lane is lost or the work is stopped.
func ExampleCluster_WorkLanes() {
	db, cleanup := openExampleDB()
	defer cleanup()
	ctx := context.Background()
	c, err := cluster.New(ctx, cluster.Config{NodeID: "worker-a", DB: db})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Shutdown(ctx)

	wctx, stop := context.WithCancel(ctx)
	var started sync.WaitGroup
	started.Add(3)
	done := make(chan error)
	go func() {
		done <- c.WorkLanes(wctx, []string{"orders-0", "orders-1", "orders-2"}, func(ctx context.Context, lane string, token uint64) error {
			fmt.Println("working", lane, "under lane token", token)
			started.Done()
			<-ctx.Done() // a real worker consumes the lane's queue until then
			return nil
		})
	}()
	started.Wait()
	stop()
	fmt.Println("WorkLanes:", <-done)
	// Unordered output:
	// working orders-0 under lane token 1
	// working orders-1 under lane token 1
	// working orders-2 under lane token 1
	// WorkLanes: context canceled
}
