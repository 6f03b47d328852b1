package clusterpgx_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/clusterpgx"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
	"github.com/sqlfence/cluster/providertest"
)

// A pgx.Tx claims a lane in one call: the claim holds until the
// transaction ends, another node is refused meanwhile, and the token is
// kept on renewal and grows on a new claim.
func TestClaimLane(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.Postgres)
	ctx := context.Background()
	pool := newPool(t, tg, 0)
	a := node(t, tg, pool, "a", nil)
	b := node(t, tg, newPool(t, tg, 0), "b", nil)

	claim := func(c *cluster.Cluster, key string) (uint64, error) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		token, err := c.ClaimLane(ctx, clusterpgx.Tx(tx), key)
		if err != nil {
			return 0, err
		}
		return token, tx.Commit(ctx)
	}
	if token, err := claim(a, "orders-1"); err != nil || token != 1 {
		t.Fatalf("first claim = %d, %v", token, err)
	}
	if token, err := claim(a, "orders-1"); err != nil || token != 1 {
		t.Fatalf("renewal = %d, %v; want the same token", token, err)
	}
	var held *cluster.LaneHeldError
	if _, err := claim(b, "orders-1"); !errors.As(err, &held) || held.Holder != "a" {
		t.Fatalf("claim of a's lane = %v, want a LaneHeldError naming a", err)
	}
	if !a.OwnsLane("orders-1") || b.OwnsLane("orders-1") {
		t.Fatal("OwnsLane disagrees with the claims")
	}
	if err := a.ReleaseLane(ctx, "orders-1"); err != nil {
		t.Fatal(err)
	}
	if token, err := claim(b, "orders-1"); err != nil || token != 2 {
		t.Fatalf("claim after the release = %d, %v; want token 2", token, err)
	}
}

// pgxTx is a pgx transaction as providertest.RunLanes begins it.
type pgxTx struct {
	clusterpgx.Querier
	tx pgx.Tx
}

func (t pgxTx) Commit() error   { return t.tx.Commit(context.Background()) }
func (t pgxTx) Rollback() error { return t.tx.Rollback(context.Background()) }

// laneTarget is a fresh store on tg for providertest.RunLanes, claiming in
// pgx transactions.
func laneTarget(t *testing.T, tg testdb.Target) providertest.LaneTarget {
	pool := newPool(t, tg, 0)
	p := pgxProvider(t, tg, pool)
	if err := p.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	return providertest.LaneTarget{
		Open: func() provider.LaneStore { return pgxProvider(t, tg, newPool(t, tg, 0)) },
		Begin: func(ctx context.Context) (providertest.Tx, error) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return nil, err
			}
			return pgxTx{clusterpgx.Tx(tx), tx}, nil
		},
	}
}

// The pgx provider passes the lane suite, claiming in pgx transactions.
func TestLaneConformance(t *testing.T) {
	providertest.RunLanes(t, func(t *testing.T) providertest.LaneTarget {
		return laneTarget(t, testdb.New(t, cluster.Postgres))
	})
}

// And through PgBouncer in transaction mode.
func TestPgBouncerLaneConformance(t *testing.T) {
	t.Parallel()
	providertest.RunLanes(t, func(t *testing.T) providertest.LaneTarget {
		return laneTarget(t, testdb.PgBouncer(t))
	})
}
