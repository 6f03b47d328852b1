package cluster_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
	"github.com/sqlfence/cluster/provider"
)

func TestReadOnlyDatabase(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		// The primary creates the schema; the read-only session then tries
		// to lead.
		start(t, tg, "primary").Shutdown(ctx)
		ro := tg.OpenDSN(t, tg.ReadOnlyDSN(t))
		p, err := cluster.NewDBProvider(ro, "", tg.Prefix)
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.Acquire(ctx, provider.LeaseRequest{Name: "leader", Holder: "a", Instance: "i", TTL: time.Second})
		if !errors.Is(err, cluster.ErrReadOnly) || !strings.Contains(err.Error(), "read-only") {
			t.Fatalf("Acquire on a read-only database = %v, want ErrReadOnly", err)
		}
		t.Logf("message: %v", err)
	})
}

func TestPoolExhausted(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		db := tg.Open(t)
		p := initProvider(t, tg, db)
		db.SetMaxOpenConns(1)
		held, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer held.Close()
		tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		_, err = p.Leader(tctx, "leader")
		if !errors.Is(err, cluster.ErrPoolExhausted) || !strings.Contains(err.Error(), "SetMaxOpenConns") {
			t.Fatalf("Leader with the pool exhausted = %v, want ErrPoolExhausted", err)
		}
	})
}

func TestHTTPStatus(t *testing.T) {
	t.Parallel()
	if got := cluster.HTTPStatus(cluster.ErrNotLeader); got != http.StatusServiceUnavailable {
		t.Fatalf("HTTPStatus(ErrNotLeader) = %d", got)
	}
	wrapped := errors.Join(errors.New("context"), cluster.ErrNotLeader)
	if got := cluster.HTTPStatus(wrapped); got != http.StatusServiceUnavailable {
		t.Fatalf("HTTPStatus(wrapped) = %d", got)
	}
	if got := cluster.HTTPStatus(errors.New("other")); got != http.StatusInternalServerError {
		t.Fatalf("HTTPStatus(other) = %d", got)
	}
	held := &cluster.LeaseHeldError{Holder: "a", FencingToken: 3, Remaining: 1500 * time.Millisecond}
	if !errors.Is(held, cluster.ErrLeaseHeld) || !strings.Contains(held.Error(), `"a"`) || !strings.Contains(held.Error(), "1.5s") {
		t.Fatalf("LeaseHeldError = %v", held)
	}
}
