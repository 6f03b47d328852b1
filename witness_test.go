package cluster_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
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

// A restore of the whole database brings back old tips and old tokens; the
// witness file remembers what this node saw.
func TestWitnessDetectsRestore(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		witness := filepath.Join(t.TempDir(), "witness.json")
		withWitness := func(c *cluster.Config) { c.WitnessFile = witness }
		db := tg.Open(t)
		a := startOn(t, tg, db, "a", withWitness)
		first := a.FencingToken()
		a.Shutdown(ctx)
		if _, err := db.ExecContext(ctx, "CREATE TABLE "+tg.Prefix+"snapshot AS SELECT * FROM "+tg.Prefix+"lease"); err != nil {
			t.Fatal(err)
		}

		a2 := startOn(t, tg, db, "a", withWitness)
		if a2.FencingToken() <= first {
			t.Fatalf("token %d after %d", a2.FencingToken(), first)
		}
		a2.Shutdown(ctx)
		b, err := os.ReadFile(witness)
		if err != nil || !strings.Contains(string(b), `"leader"`) {
			t.Fatalf("witness file: %q, %v", b, err)
		}

		// The "restore": the lease table comes back from a snapshot taken
		// during the first term (its guard triggers refuse lowering a token
		// in place, so restoring is the way tokens go back).
		for _, q := range []string{
			"DROP TABLE " + tg.Prefix + "lease",
			"CREATE TABLE " + tg.Prefix + "lease AS SELECT * FROM " + tg.Prefix + "snapshot",
		} {
			if _, err := db.ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		cfg := tg.Config(t, tg.Open(t), "a")
		withWitness(&cfg)
		_, err = cluster.New(ctx, cfg)
		if !errors.Is(err, cluster.ErrRollbackDetected) || !strings.Contains(err.Error(), "witness") {
			t.Fatalf("New over a restored database = %v, want ErrRollbackDetected citing the witness", err)
		}
		t.Logf("restore: %v", err)

		// A node without the witness cannot tell; that is why it exists.
		start(t, tg, "d").Shutdown(ctx)
	})
}

// On SQLite a restore is a file copy: tips, rows and lease all go back.
func TestWitnessDetectsWholeFileRestore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tg := testdb.New(t, cluster.SQLite)
	path := strings.TrimPrefix(strings.SplitN(tg.DSN, "?", 2)[0], "file:")
	witness := filepath.Join(t.TempDir(), "witness.json")
	db := tg.Open(t)
	table := createAuditTable(t, tg, db)
	cfg := func(c *cluster.Config) {
		withAudit(table)(c)
		c.WitnessFile = witness
	}
	a := startOn(t, tg, db, "a", cfg)
	appendAudit(t, tg, a, table, 1, 2)
	a.Shutdown(ctx)
	if _, err := db.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	backup := path + ".bak"
	copyFile(t, path, backup)

	db2 := tg.Open(t)
	a2 := startOn(t, tg, db2, "a", cfg)
	appendAudit(t, tg, a2, table, 3, 5)
	a2.Shutdown(ctx)
	db2.Close()

	// Restore the snapshot, WAL files and all.
	for _, suffix := range []string{"-wal", "-shm"} {
		os.Remove(path + suffix)
	}
	copyFile(t, backup, path)

	c := tg.Config(t, tg.Open(t), "a")
	cfg(&c)
	_, err := cluster.New(ctx, c)
	if !errors.Is(err, cluster.ErrRollbackDetected) {
		t.Fatalf("New over a restored file = %v, want ErrRollbackDetected", err)
	}
	t.Logf("restore: %v", err)
}

// A database that lost commits a node saw and then went on writing (a
// failover to a standby that had not received them, or a restore
// followed by more work) reaches the witness's heights again with other
// rows. The witness must still tell: the row it saw at the tip is gone.
func TestWitnessDetectsDivergedHistory(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		witness := filepath.Join(t.TempDir(), "witness.json")
		db := tg.Open(t)
		table := createAuditTable(t, tg, db)
		withWitness := func(c *cluster.Config) {
			withAudit(table)(c)
			c.WitnessFile = witness
		}
		a := startOn(t, tg, db, "a", withWitness)
		appendAudit(t, tg, a, table, 1, 5)
		a.Shutdown(ctx)

		// The database loses rows 3..5, then node b, which saw none of
		// them, leads and writes its own rows 3..8.
		restoreChain(t, tg, db, table, 2)
		b := startOn(t, tg, tg.Open(t), "b", withAudit(table))
		appendAuditSalted(t, tg, b, table, 3, 8, "b")
		b.Shutdown(ctx)

		cfg := tg.Config(t, tg.Open(t), "a")
		withWitness(&cfg)
		c, err := cluster.New(ctx, cfg)
		if err == nil {
			c.Shutdown(ctx)
		}
		if !errors.Is(err, cluster.ErrRollbackDetected) || !strings.Contains(err.Error(), "another history") {
			t.Fatalf("New over a database with another history past the witness = %v, want ErrRollbackDetected (another history)", err)
		}
		t.Logf("diverged: %v", err)

		// The same history, only longer, passes.
		cfg = tg.Config(t, tg.Open(t), "b2")
		w2 := filepath.Join(t.TempDir(), "witness.json")
		withAudit(table)(&cfg)
		cfg.WitnessFile = w2
		b2, err := cluster.New(ctx, cfg)
		if err != nil {
			t.Fatalf("New b2: %v", err)
		}
		b2.Shutdown(ctx)
		b3 := startOn(t, tg, tg.Open(t), "b3", withAudit(table))
		appendAuditSalted(t, tg, b3, table, 9, 12, "b")
		b3.Shutdown(ctx)
		if b2, err = cluster.New(ctx, cfg); err != nil {
			t.Fatalf("New b2 after the chain grew on the same history: %v", err)
		}
		b2.Shutdown(ctx)
	})
}
