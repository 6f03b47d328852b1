// Command httpmux is a small service that joins a cluster, mounts the
// discovery handler on its existing http.ServeMux, accepts writes only
// while it leads, and runs a scheduled report job on the leader alone
// (cluster.RunWhileLeader). Run two of them against one database file and stop the
// leader (Ctrl-C) to watch the other take over within a heartbeat (half a
// second by default: processes on SQLite cannot notify each other, so a
// follower finds the lease released at its next poll; kill -9 the leader
// and it takes over when the lease expires, after -ttl):
//
//	go run ./examples/httpmux -node node-1 -addr 127.0.0.1:8081 -db /tmp/orders.db &
//	go run ./examples/httpmux -node node-2 -addr 127.0.0.1:8082 -db /tmp/orders.db &
//	curl -s 127.0.0.1:8082/cluster/leader
//	curl -s -X POST -d 'item=book' 127.0.0.1:8081/orders
//
// It uses the package-level API: one cluster member per process.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	_ "modernc.org/sqlite"

	"github.com/sqlfence/cluster"
)

func main() {
	node := flag.String("node", "node-1", "this node's ID")
	addr := flag.String("addr", "127.0.0.1:8080", "address to listen on")
	path := flag.String("db", filepath.Join(os.TempDir(), "httpmux-orders.db"), "SQLite database file shared by the nodes")
	every := flag.Duration("report-every", 10*time.Second, "how often the leader writes an order report")
	ttl := flag.Duration("ttl", 2*time.Second, "LeaseTTL: how long a crashed leader's lease outlives it")
	heartbeat := flag.Duration("heartbeat", 500*time.Millisecond, "HeartbeatInterval: how often the leader renews and a follower polls")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	db, err := sql.Open("sqlite", "file:"+*path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	s := &service{db: db}
	if err := s.migrate(ctx); err != nil {
		log.Fatal(err)
	}

	// Transitions arrive on a channel; the Cluster never blocks sending.
	events := make(chan cluster.Event, 64)
	go func() {
		for e := range events {
			log.Printf("%s: %s (fencing token %d) %s", e.NodeID, e.Kind, e.FencingToken, e.Reason)
		}
	}()
	if err := cluster.Init(ctx, cluster.Config{
		NodeID:                *node,
		DB:                    db,
		Endpoint:              "http://" + *addr,
		AllowInsecureEndpoint: true, // a local demo; use https in production
		LeaseTTL:              *ttl,
		HeartbeatInterval:     *heartbeat,
		Events:                events,
	}); err != nil {
		log.Fatal(err)
	}

	// The report job runs on the leader only, in every term it leads, and
	// stops when the term ends; Shutdown waits for it before releasing.
	go cluster.Default().RunWhileLeader(ctx, func(ctx context.Context, token uint64) error {
		return s.reportEvery(ctx, *every)
	})

	srv := &http.Server{Addr: *addr, Handler: s.routes(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
			log.Fatal(err)
		}
	}()
	log.Printf("%s listening on http://%s", *node, *addr)

	<-ctx.Done()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv.Shutdown(shutdownCtx)
	if err := cluster.Shutdown(shutdownCtx); err != nil { // releases the lease
		log.Print(err)
	}
}

// service is an order service whose writes only the leader accepts.
type service struct{ db *sql.DB }

func (s *service) migrate(ctx context.Context) error {
	_, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (
		id INTEGER PRIMARY KEY AUTOINCREMENT,
		item TEXT NOT NULL,
		fencing_token INTEGER NOT NULL,
		node TEXT NOT NULL)`)
	if err == nil {
		_, err = s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS reports (
			id INTEGER PRIMARY KEY AUTOINCREMENT,
			orders INTEGER NOT NULL,
			fencing_token INTEGER NOT NULL,
			node TEXT NOT NULL)`)
	}
	return err
}

// reportEvery writes an order report every interval until ctx ends, which
// happens when this node's term does.
func (s *service) reportEvery(ctx context.Context, every time.Duration) error {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if err := s.report(ctx); err != nil && !errors.Is(err, cluster.ErrNotLeader) {
			log.Printf("report: %v", err)
		}
	}
}

// report writes one report, fenced: the context says when to stop, but
// only the database can refuse a report written after the term ended.
func (s *service) report(ctx context.Context) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	token, err := cluster.Default().Fence(ctx, tx)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO reports (orders, fencing_token, node) SELECT COUNT(*), ?, ? FROM orders",
		token, cluster.Default().NodeID()); err != nil {
		return err
	}
	return tx.Commit()
}

// routes adds the cluster's discovery handler to the service's own mux.
func (s *service) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/cluster/leader", cluster.DiscoveryHandler())
	mux.HandleFunc("POST /orders", s.createOrder)
	mux.HandleFunc("GET /orders", s.countOrders)
	return mux
}

// createOrder is a write: followers refuse it with 503 so the load balancer
// retries on the leader.
func (s *service) createOrder(w http.ResponseWriter, r *http.Request) {
	if err := cluster.RequireLeader(); err != nil {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "this node is not the leader; GET /cluster/leader tells who is", cluster.HTTPStatus(err))
		return
	}
	item := r.FormValue("item")
	if item == "" || len(item) > 200 {
		http.Error(w, "item is required, at most 200 bytes", http.StatusBadRequest)
		return
	}
	// Fence the write: the database refuses it if this node lost the lease
	// since RequireLeader, and no other node can take the lease before it
	// commits. The order records the term it was written under.
	tx, err := s.db.BeginTx(r.Context(), nil)
	if err != nil {
		log.Printf("begin: %v", err)
		http.Error(w, "could not store the order", http.StatusInternalServerError)
		return
	}
	defer tx.Rollback()
	token, err := cluster.Default().Fence(r.Context(), tx)
	if err != nil {
		if errors.Is(err, cluster.ErrNotLeader) {
			http.Error(w, "this node lost the lease; retry", cluster.HTTPStatus(err))
			return
		}
		log.Printf("fence: %v", err)
		http.Error(w, "could not store the order", http.StatusInternalServerError)
		return
	}
	res, err := tx.ExecContext(r.Context(), "INSERT INTO orders (item, fencing_token, node) VALUES (?, ?, ?)",
		item, token, cluster.Default().NodeID())
	if err == nil {
		err = tx.Commit()
	}
	if err != nil {
		log.Printf("insert order: %v", err)
		http.Error(w, "could not store the order", http.StatusInternalServerError)
		return
	}
	id, _ := res.LastInsertId()
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "order %d created by %s under fencing token %d\n", id, cluster.Default().NodeID(), token)
}

// countOrders is a read: every node serves it.
func (s *service) countOrders(w http.ResponseWriter, r *http.Request) {
	var n int
	if err := s.db.QueryRowContext(r.Context(), "SELECT COUNT(*) FROM orders").Scan(&n); err != nil {
		log.Printf("count orders: %v", err)
		http.Error(w, "could not count orders", http.StatusInternalServerError)
		return
	}
	fmt.Fprintf(w, "%d orders\n", n)
}
