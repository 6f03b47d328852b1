package main

import (
	"context"
	"testing"

	"github.com/sqlfence/cluster"
)

// TestWriteLocked checks the probe the pause fault uses on SQLite: it sees
// the write lock while another session's write transaction holds it, and
// not before or after.
func TestWriteLocked(t *testing.T) {
	ctx := context.Background()
	tg, err := newTarget(cluster.SQLite, "", t.TempDir(), "lock_")
	if err != nil {
		t.Fatal(err)
	}
	db, err := tg.open(tg.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE TABLE t (x INTEGER)"); err != nil {
		t.Fatal(err)
	}
	probe, err := tg.openProbe()
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	check := func(when string, want bool) {
		t.Helper()
		held, err := tg.writeLocked(ctx, probe)
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if held != want {
			t.Errorf("%s: writeLocked = %v, want %v", when, held, want)
		}
	}
	check("before any transaction", false)
	tx, err := db.BeginTx(ctx, nil) // IMMEDIATE: takes the write lock at BEGIN
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	check("inside a write transaction", true)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	check("after its commit", false)

	if p, err := (target{dialect: cluster.Postgres}).openProbe(); p != nil || err != nil {
		t.Errorf("openProbe on PostgreSQL = %v, %v; want no pool", p, err)
	}
}
