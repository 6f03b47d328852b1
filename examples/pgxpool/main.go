// Command pgxpool is a service on pgx alone (pgxpool and pgx transactions,
// no database/sql): two nodes elect a leader over PostgreSQL, the leader
// fences its writes in a pgx.Tx, and after a forced takeover the old
// leader's fenced transaction is refused by the database.
//
//	go run ./examples/pgxpool -dsn 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//
// It creates tables with a random prefix and drops them when it ends.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/clusterpgx"
)

func main() {
	dsn := flag.String("dsn", os.Getenv("CLUSTER_DSN"), "PostgreSQL DSN (default $CLUSTER_DSN)")
	flag.Parse()
	if *dsn == "" {
		*dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	if err := run(context.Background(), *dsn); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, dsn string) error {
	var random [4]byte
	rand.Read(random[:])
	prefix := "pgxdemo_" + hex.EncodeToString(random[:]) + "_"
	// Each node has its own small pool, as separate processes would.
	poolA, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer poolA.Close()
	poolB, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer poolB.Close()
	defer dropTables(poolB, prefix)
	if _, err := poolA.Exec(ctx, "CREATE TABLE "+prefix+"orders (id BIGSERIAL PRIMARY KEY, item TEXT NOT NULL, fencing_token BIGINT NOT NULL)"); err != nil {
		return err
	}

	start := func(pool *pgxpool.Pool, id string) (*cluster.Cluster, error) {
		p, err := clusterpgx.NewProviderWithPrefix(pool, prefix)
		if err != nil {
			return nil, err
		}
		// A long heartbeat, so the first leader does not notice the forced
		// takeover below before it tries to write: that is the stale leader
		// the database must refuse.
		return cluster.New(ctx, cluster.Config{NodeID: id, Provider: p,
			LeaseTTL: 6 * time.Second, HeartbeatInterval: 2 * time.Second})
	}
	a, err := start(poolA, "node-a")
	if err != nil {
		return err
	}
	defer a.Shutdown(ctx)
	fmt.Printf("node-a leads: %v, fencing token %d\n", a.IsLeader(), a.FencingToken())

	// writeOrder is ordinary pgx code (sqlc's queries.WithTx(tx) works
	// the same): a transaction begun and fenced in one round trip, then
	// the writes, under the token it returns.
	writeOrder := func(c *cluster.Cluster, pool *pgxpool.Pool, item string) error {
		tx, token, err := clusterpgx.BeginFenced(ctx, c, pool, pgx.TxOptions{})
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, "INSERT INTO "+prefix+"orders (item, fencing_token) VALUES ($1, $2)", item, int64(token)); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	if err := writeOrder(a, poolA, "book"); err != nil {
		return err
	}
	fmt.Println("node-a wrote an order under its token")

	// Take the lease away from node-a behind its back, as a pause past
	// its lease would, and start node-b, which takes over.
	if _, err := poolB.Exec(ctx, "UPDATE "+prefix+"lease SET expires_at = 0"); err != nil {
		return err
	}
	b, err := start(poolB, "node-b")
	if err != nil {
		return err
	}
	defer b.Shutdown(ctx)
	fmt.Printf("node-b leads: %v, fencing token %d; node-a still believes it leads: %v\n", b.IsLeader(), b.FencingToken(), a.IsLeader())

	err = writeOrder(a, poolA, "lamp")
	fmt.Println("node-a's write refused by the database:", errors.Is(err, cluster.ErrStaleFencingToken))
	if err := writeOrder(b, poolB, "desk"); err != nil {
		return err
	}
	var n int
	if err := poolB.QueryRow(ctx, "SELECT COUNT(*) FROM "+prefix+"orders").Scan(&n); err != nil {
		return err
	}
	fmt.Printf("%d orders committed, each under its leader's token\n", n)
	return nil
}

// dropTables removes the demo's tables, and the functions the cluster
// schema made under the same prefix (the lease statements' and the guard
// triggers'), which outlive the tables.
func dropTables(pool *pgxpool.Pool, prefix string) {
	ctx := context.Background()
	list := func(q string) []string {
		rows, err := pool.Query(ctx, q, strings.ReplaceAll(prefix, "_", `\_`)+"%")
		if err != nil {
			return nil
		}
		names, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		return names
	}
	for _, t := range list("SELECT table_name::text FROM information_schema.tables WHERE table_schema = current_schema() AND table_name LIKE $1") {
		pool.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{t}.Sanitize()+" CASCADE")
	}
	for _, f := range list("SELECT oid::regprocedure::text FROM pg_proc WHERE pronamespace = current_schema()::regnamespace AND proname LIKE $1") {
		pool.Exec(ctx, "DROP FUNCTION IF EXISTS "+f)
	}
}
