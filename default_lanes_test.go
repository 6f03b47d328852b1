package cluster_test

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// The package-level lane and config-version calls: in single-node mode
// this process owns every lane and claims without a database; after a
// failed Init they fail closed, as Fence does; once Init succeeds they
// answer for the member; after Shutdown they fail with ErrShutdown.
func TestDefaultLanes(t *testing.T) {
	useDefault(t)
	ctx := context.Background()
	goroutines := runtime.NumGoroutine()

	// Single-node mode: no database, no goroutine.
	if cluster.Default().Clustered() {
		t.Fatal("Clustered before Init")
	}
	if l, err := cluster.Default().LaneOwner(ctx, "orders-1"); err != nil || l == nil || l.Key != "orders-1" || l.Holder != cluster.SingleNodeID ||
		l.FencingToken != 0 || !l.ExpiresAt.IsZero() {
		t.Fatalf("LaneOwner in single-node mode = %+v, %v; want this node, token 0, no expiry", l, err)
	}
	if _, err := cluster.Default().LaneOwner(ctx, ""); !errors.Is(err, cluster.ErrInvalidConfig) {
		t.Fatalf("LaneOwner of an empty key = %v", err)
	}
	if !cluster.Default().OwnsLane("orders-1") || cluster.Default().Lanes() != nil {
		t.Fatalf("single node: OwnsLane %v, Lanes %v", cluster.Default().OwnsLane("orders-1"), cluster.Default().Lanes())
	}
	if token, err := cluster.Default().ClaimLane(ctx, untouchedTx{}, "orders-1"); token != 0 || err != nil {
		t.Fatalf("ClaimLane in single-node mode = %d, %v; want 0, nil without touching a database", token, err)
	}
	if _, err := cluster.Default().ClaimLane(ctx, untouchedTx{}, ""); !errors.Is(err, cluster.ErrInvalidConfig) {
		t.Fatalf("ClaimLane of an empty key = %v", err)
	}
	if err := cluster.Default().ReleaseLane(ctx, "orders-1"); err != nil {
		t.Fatal(err)
	}
	if v, err := cluster.Default().ConfigVersion(ctx); v != 0 || err != nil {
		t.Fatalf("ConfigVersion in single-node mode = %d, %v", v, err)
	}
	if v, err := cluster.Default().BumpConfigVersion(ctx); v != 0 || err != nil || cluster.Default().ConfigVersionCached() != 0 {
		t.Fatalf("BumpConfigVersion in single-node mode = %d, %v; cached %d; want 0 and nothing bumped", v, err, cluster.Default().ConfigVersionCached())
	}
	if n := runtime.NumGoroutine(); n > goroutines {
		t.Fatalf("single-node lanes started %d goroutines", n-goroutines)
	}

	// A failed Init fails closed.
	if err := cluster.Init(ctx, fakeConfig(t, "n", initFailer{&fakeProvider{}, errors.New("database unreachable")})); err == nil {
		t.Fatal("Init over a failing provider succeeded")
	}
	if cluster.Default().OwnsLane("orders-1") {
		t.Fatal("OwnsLane after a failed Init")
	}
	if !cluster.Default().Clustered() {
		t.Fatal("not Clustered after a failed Init: the process left single-node mode when Init was called")
	}
	if l, err := cluster.Default().LaneOwner(ctx, "orders-1"); l != nil || err == nil || !strings.Contains(err.Error(), "database unreachable") {
		t.Fatalf("LaneOwner after a failed Init = %+v, %v", l, err)
	}
	if _, err := cluster.Default().ClaimLane(ctx, untouchedTx{}, "orders-1"); !errors.Is(err, cluster.ErrStaleFencingToken) || !strings.Contains(err.Error(), "database unreachable") {
		t.Fatalf("ClaimLane after a failed Init = %v, want ErrStaleFencingToken with Init's error", err)
	}
	if _, err := cluster.Default().ConfigVersion(ctx); err == nil || !strings.Contains(err.Error(), "database unreachable") {
		t.Fatalf("ConfigVersion after a failed Init = %v", err)
	}
	if _, err := cluster.Default().BumpConfigVersion(ctx); err == nil {
		t.Fatal("BumpConfigVersion after a failed Init succeeded")
	}

	// Running: the member answers.
	tg := testdb.New(t, cluster.SQLite)
	db := tg.Open(t)
	if err := cluster.Init(ctx, tg.Config(t, db, "n")); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	token, err := cluster.Default().ClaimLane(ctx, tx, "orders-1")
	if err != nil || token != 1 {
		t.Fatalf("ClaimLane = %d, %v; want token 1", token, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if !cluster.Default().OwnsLane("orders-1") || cluster.Default().OwnsLane("orders-2") || !slices.Equal(cluster.Default().Lanes(), []string{"orders-1"}) {
		t.Fatalf("OwnsLane %v/%v, Lanes %v", cluster.Default().OwnsLane("orders-1"), cluster.Default().OwnsLane("orders-2"), cluster.Default().Lanes())
	}
	if l, err := cluster.Default().LaneOwner(ctx, "orders-1"); err != nil || l == nil || l.Holder != "n" || l.FencingToken != token || l.Remaining <= 0 {
		t.Fatalf("LaneOwner = %+v, %v; want n with token %d", l, err, token)
	}
	if l, err := cluster.Default().LaneOwner(ctx, "orders-2"); l != nil || err != nil {
		t.Fatalf("LaneOwner of a lane never claimed = %+v, %v; want nil, nil", l, err)
	}
	if !cluster.Default().Clustered() {
		t.Fatal("not Clustered while running")
	}
	if v, err := cluster.Default().BumpConfigVersion(ctx); v != 1 || err != nil || cluster.Default().ConfigVersionCached() != 1 {
		t.Fatalf("BumpConfigVersion = %d, %v; cached %d", v, err, cluster.Default().ConfigVersionCached())
	}
	if v, err := cluster.Default().ConfigVersion(ctx); v != 1 || err != nil {
		t.Fatalf("ConfigVersion = %d, %v", v, err)
	}

	// Shut down.
	if err := cluster.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.Default().ClaimLane(ctx, untouchedTx{}, "orders-1"); !errors.Is(err, cluster.ErrShutdown) || !errors.Is(err, cluster.ErrStaleFencingToken) {
		t.Fatalf("ClaimLane after Shutdown = %v", err)
	}
	if cluster.Default().OwnsLane("orders-1") || cluster.Default().Lanes() != nil {
		t.Fatal("lanes owned after Shutdown")
	}
	if _, err := cluster.Default().LaneOwner(ctx, "orders-1"); !errors.Is(err, cluster.ErrShutdown) {
		t.Fatalf("LaneOwner after Shutdown = %v", err)
	}
	if !cluster.Default().Clustered() {
		t.Fatal("not Clustered after Shutdown")
	}
	if err := cluster.Default().ReleaseLane(ctx, "orders-1"); !errors.Is(err, cluster.ErrShutdown) {
		t.Fatalf("ReleaseLane after Shutdown = %v", err)
	}
	if _, err := cluster.Default().ConfigVersion(ctx); !errors.Is(err, cluster.ErrShutdown) {
		t.Fatalf("ConfigVersion after Shutdown = %v", err)
	}
	if _, err := cluster.Default().BumpConfigVersion(ctx); !errors.Is(err, cluster.ErrShutdown) {
		t.Fatalf("BumpConfigVersion after Shutdown = %v", err)
	}
	if got := cluster.Default().ConfigVersionCached(); got != 1 {
		t.Fatalf("ConfigVersionCached after Shutdown = %d, want the last version seen, 1", got)
	}
}
