package clusterpgx_test

import (
	"context"
	"errors"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/clusterpgx"
)

// A service on pgxpool holds the lease through the pool and writes in
// transactions begun and fenced in one round trip. (Compiled, not run: it
// needs a PostgreSQL.)
func ExampleBeginFenced() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db.internal/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	provider, err := clusterpgx.NewProvider(pool)
	if err != nil {
		log.Fatal(err)
	}
	c, err := cluster.New(ctx, cluster.Config{NodeID: "api-1", Provider: provider})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Shutdown(ctx)

	createOrder := func(ctx context.Context, item string) error {
		tx, token, err := clusterpgx.BeginFenced(ctx, c, pool, pgx.TxOptions{})
		if errors.Is(err, cluster.ErrNotLeader) {
			return err // not (or no longer) the leader: nothing was written
		}
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		// sqlc: queries.WithTx(tx).CreateOrder(ctx, ...)
		if _, err := tx.Exec(ctx, "INSERT INTO orders (item, fencing_token) VALUES ($1, $2)", item, int64(token)); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	if err := createOrder(ctx, "book"); err != nil {
		log.Print(err)
	}
}

// A service on database/sql with pgx's stdlib driver (sqlc's database/sql
// code) opens its pool with OpenDB, holds the lease through it, and begins
// fenced transactions in one round trip with Cluster.BeginFenced (what
// BeginFencedSQL does too). (Compiled, not run: it needs a PostgreSQL.)
func ExampleOpenDB() {
	ctx := context.Background()
	connConfig, err := pgx.ParseConfig("postgres://app@db.internal/app")
	if err != nil {
		log.Fatal(err)
	}
	db := clusterpgx.OpenDB(*connConfig)
	defer db.Close()
	provider, err := clusterpgx.NewStdlibProvider(db, "")
	if err != nil {
		log.Fatal(err)
	}
	c, err := cluster.New(ctx, cluster.Config{NodeID: "api-1", Provider: provider})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Shutdown(ctx)

	createOrder := func(ctx context.Context, item string) error {
		tx, token, err := c.BeginFenced(ctx, db, nil)
		if err != nil {
			return err // errors.Is(err, cluster.ErrNotLeader): nothing was written
		}
		defer tx.Rollback()
		// sqlc: queries.WithTx(tx).CreateOrder(ctx, ...)
		if _, err := tx.ExecContext(ctx, "INSERT INTO orders (item, fencing_token) VALUES ($1, $2)", item, int64(token)); err != nil {
			return err
		}
		return tx.Commit()
	}
	if err := createOrder(ctx, "book"); err != nil {
		log.Print(err)
	}
}

// Tx adapts a pgx transaction to the cluster's calls that run inside the
// caller's transaction: Fence, ClaimLane and AdvanceTip. (Compiled, not
// run: it needs a PostgreSQL.)
func ExampleTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db.internal/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	provider, err := clusterpgx.NewProvider(pool)
	if err != nil {
		log.Fatal(err)
	}
	c, err := cluster.New(ctx, cluster.Config{NodeID: "worker-1", Provider: provider})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Shutdown(ctx)

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	token, err := c.ClaimLane(ctx, clusterpgx.Tx(tx), "tenant-42") // or c.Fence(ctx, clusterpgx.Tx(tx))
	if err != nil {
		log.Fatal(err) // errors.Is(err, cluster.ErrLaneHeld): another node owns the lane
	}
	if _, err := tx.Exec(ctx, "UPDATE tenants SET plan = $1, lane_token = $2 WHERE id = $3", "pro", int64(token), 42); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
}
