package cluster_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// The witness file records every AdvanceTip, so a restore of the whole
// database (tips, high-water marks and table alike) to a point inside the
// current term is caught at the next boot; an AdvanceTip whose transaction
// rolled back is not mistaken for one.
func TestWitnessCatchesRestoreWithinTerm(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		dir := t.TempDir()
		witnessIn := func(name string) func(*cluster.Config) {
			return func(c *cluster.Config) { c.WitnessFile = filepath.Join(dir, name) }
		}
		db := tg.Open(t)
		table := createAuditTable(t, tg, db)

		// An AdvanceTip whose transaction rolled back is pending in the
		// witness, and is not mistaken for a restore at the next boot.
		a := startOn(t, tg, db, "a", withAudit(table), witnessIn("first.json"))
		appendAudit(t, tg, a, table, 1, 3)
		tx, err := a.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.AdvanceTip(ctx, tx, "audit", 4, hashOf(4, "a")); err != nil {
			t.Fatal(err)
		}
		tx.Rollback()
		a.Shutdown(ctx)
		startOn(t, tg, tg.Open(t), "a", withAudit(table), witnessIn("first.json")).Shutdown(ctx)

		// A term that begins at tip 3 (recorded at its acquisition) and
		// advances to 9; then the whole database goes back to tip 7, a point
		// inside that term, which only the AdvanceTip records can show.
		b := startOn(t, tg, tg.Open(t), "b", withAudit(table), witnessIn("second.json"))
		appendAudit(t, tg, b, table, 4, 9)
		b.Shutdown(ctx)
		restoreChain(t, tg, db, table, 7)
		cfg := tg.Config(t, tg.Open(t), "b")
		withAudit(table)(&cfg)
		witnessIn("second.json")(&cfg)
		if _, err := cluster.New(ctx, cfg); !errors.Is(err, cluster.ErrRollbackDetected) {
			t.Fatalf("New after a restore to a point inside the last term = %v, want ErrRollbackDetected", err)
		} else {
			t.Log(err)
		}
	})
}
