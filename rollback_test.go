package cluster_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// The guard triggers refuse, in SQL, what AdvanceTip refuses, and any
// change that would let a fencing token go back.
func TestGuardsRefuseRawSQL(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		db := tg.Open(t)
		table := createAuditTable(t, tg, db)
		// a renews rarely, so b can take over before a notices.
		a := startOn(t, tg, db, "a", withAudit(table), slowRenew)
		appendAudit(t, tg, a, table, 1, 3)
		tips := tg.Prefix + "chain_tips"
		for name, q := range map[string]string{
			"older token":         "UPDATE " + tips + " SET at_counter = 4, fencing_token = fencing_token - 1",
			"future token":        "UPDATE " + tips + " SET at_counter = 4, fencing_token = fencing_token + 5",
			"counter backwards":   "UPDATE " + tips + " SET at_counter = 1",
			"delete":              "DELETE FROM " + tips,
			"insert future token": "INSERT INTO " + tips + " (scope, lease_name, at_counter, row_hash, fencing_token, updated_at) VALUES ('other', 'leader', 1, 'x', 9, 0)",
			"insert unknown name": "INSERT INTO " + tips + " (scope, lease_name, at_counter, row_hash, fencing_token, updated_at) VALUES ('other', 'nope', 1, 'x', 1, 0)",
			"lower lease token":   "UPDATE " + tg.Prefix + "lease SET fencing_token = fencing_token - 1",
			"reset lease token":   "UPDATE " + tg.Prefix + "lease SET fencing_token = 0, expires_at = 0",
			"delete lease":        "DELETE FROM " + tg.Prefix + "lease",
		} {
			if _, err := db.ExecContext(ctx, q); err == nil {
				t.Errorf("%s: raw SQL was accepted: %s", name, q)
			} else {
				t.Logf("%s: refused: %v", name, err)
			}
		}
		// The current token is accepted.
		q := "UPDATE " + tips + " SET at_counter = 3, updated_at = 1"
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("a valid raw update was refused: %v", err)
		}

		// After a takeover, the old token is refused even with a higher counter.
		expireLease(t, tg, db)
		b := startOn(t, tg, tg.Open(t), "b", withAudit(table))
		if !b.IsLeader() {
			t.Fatal("b does not lead")
		}
		tx, err := a.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		err = a.AdvanceTip(ctx, tx, "audit", 10, []byte("h"))
		if !errors.Is(err, cluster.ErrStaleFencingToken) {
			t.Fatalf("AdvanceTip by the old leader = %v, want ErrStaleFencingToken", err)
		}
		tx.Rollback()
		q = "INSERT INTO " + tips + " (scope, lease_name, at_counter, row_hash, fencing_token, updated_at) VALUES ('other', 'leader', 1, 'x', 1, 0)"
		if _, err := db.ExecContext(ctx, q); err == nil {
			t.Fatal("a tip under the previous term's token was accepted")
		}
	})
}

func TestAdvanceTipRules(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		db, _, a := auditLeader(t, tg, 2)
		try := func(chain string, counter uint64, hash []byte) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			return a.AdvanceTip(ctx, tx, chain, counter, hash)
		}
		if err := try("audit", 1, []byte("h")); !errors.Is(err, cluster.ErrTipBackwards) {
			t.Fatalf("backwards tip = %v, want ErrTipBackwards", err)
		}
		if err := try("ledger", 3, []byte("h")); !errors.Is(err, cluster.ErrInvalidConfig) {
			t.Fatalf("unknown chain = %v", err)
		}
		if err := try("audit", 3, nil); err == nil || !strings.Contains(err.Error(), "row hash") {
			t.Fatalf("empty hash = %v", err)
		}
		if err := try("audit", 1<<63, []byte("h")); err == nil || !strings.Contains(err.Error(), "BIGINT") {
			t.Fatalf("huge counter = %v", err)
		}
		// The same counter must mean the same row: recording it again is
		// idempotent, another hash there is a substitution.
		if err := try("audit", 2, hashOf(2, "a")); err != nil {
			t.Fatalf("re-recording the tip at the same counter with the same hash = %v", err)
		}
		if err := try("audit", 2, []byte("another row at counter 2")); !errors.Is(err, cluster.ErrTipRewritten) {
			t.Fatalf("re-recording the tip at the same counter with another hash = %v, want ErrTipRewritten", err)
		}
	})
}

func TestRollbackDetectedAtBoot(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		db, table, a := auditLeader(t, tg, 5)
		a.Shutdown(ctx)

		// An untouched chain passes, and so does a chain with rows beyond
		// its tip.
		if _, err := db.ExecContext(ctx, bind(tg.Dialect, "INSERT INTO "+table+" (monotonic_counter, row_hash, payload) VALUES (?, ?, ?)"), 6, []byte("x"), "unrecorded"); err != nil {
			t.Fatal(err)
		}
		start(t, tg, "b", withAudit(table)).Shutdown(ctx)

		newNode := func() error {
			cfg := tg.Config(t, tg.Open(t), "c")
			withAudit(table)(&cfg)
			c, err := cluster.New(ctx, cfg)
			if err == nil {
				c.Shutdown(ctx)
			}
			return err
		}

		// Substitution: the row at the tip counter has another hash.
		if _, err := db.ExecContext(ctx, bind(tg.Dialect, "UPDATE "+table+" SET row_hash = ? WHERE monotonic_counter = 5"), []byte("forged")); err != nil {
			t.Fatal(err)
		}
		err := newNode()
		if !errors.Is(err, cluster.ErrRollbackDetected) || !strings.Contains(err.Error(), `chain "audit"`) ||
			!strings.Contains(err.Error(), "substituted") || !strings.Contains(err.Error(), "forged") {
			t.Fatalf("substituted row: New = %v", err)
		}
		t.Logf("substitution: %v", err)

		// Truncation: the table ends below the tip.
		if _, err := db.ExecContext(ctx, "DELETE FROM "+table+" WHERE monotonic_counter >= 4"); err != nil {
			t.Fatal(err)
		}
		err = newNode()
		if !errors.Is(err, cluster.ErrRollbackDetected) || !strings.Contains(err.Error(), "up to counter 3") || !strings.Contains(err.Error(), "counter 5") {
			t.Fatalf("truncated table: New = %v", err)
		}
		t.Logf("truncation: %v", err)

		if _, err := db.ExecContext(ctx, "DELETE FROM "+table); err != nil {
			t.Fatal(err)
		}
		if err := newNode(); !errors.Is(err, cluster.ErrRollbackDetected) || !strings.Contains(err.Error(), "no rows") {
			t.Fatalf("emptied table: New = %v", err)
		}
	})
}

// A follower that took over finds the chain rolled back: it releases the
// lease, reports rollback-detected and stops campaigning.
func TestRollbackDetectedAtAcquisition(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		db, table, a := auditLeader(t, tg, 3)
		b := start(t, tg, "b", withAudit(table))
		if _, err := db.ExecContext(ctx, "DELETE FROM "+table+" WHERE monotonic_counter = 3"); err != nil {
			t.Fatal(err)
		}
		a.Shutdown(ctx)
		e := b.events.wait(t, cluster.EventRollbackDetected, 3*time.Second)
		if !errors.Is(e.Err, cluster.ErrRollbackDetected) || !strings.Contains(e.Err.Error(), `chain "audit"`) {
			t.Fatalf("rollback event error = %v", e.Err)
		}
		time.Sleep(5 * testdb.Heartbeat) // a sleep, as nothing is to happen: b would campaign every heartbeat
		if b.IsLeader() {
			t.Fatal("b leads over a rolled-back database")
		}
		for _, e := range b.events.all() {
			if e.Kind == cluster.EventLeaseAcquired {
				t.Fatalf("b reported leadership: %+v", e)
			}
		}
		// It released the lease: a healthy node could take it at once.
		if l, err := b.CurrentLeader(ctx); err != nil || l != nil {
			t.Fatalf("leader after b backed off = %+v, %v", l, err)
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

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestChainConfigErrors(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, cluster.SQLite).Open(t)
	for name, tt := range map[string]struct {
		chains []cluster.Chain
		want   string
	}{
		"no name":      {[]cluster.Chain{{Table: "audit"}}, "Chains[0].Name is required"},
		"duplicate":    {[]cluster.Chain{{Name: "a", Table: "t1"}, {Name: "a", Table: "t2"}}, `Chains[1].Name ("a") is used`},
		"bad table":    {[]cluster.Chain{{Name: "a", Table: "audit; DROP TABLE x"}}, "Chains[0].Table"},
		"quoted table": {[]cluster.Chain{{Name: "a", Table: `"Audit"`}}, "Chains[0].Table"},
		"bad counter":  {[]cluster.Chain{{Name: "a", Table: "audit", CounterColumn: "n)"}}, "Chains[0].CounterColumn"},
		"bad hash":     {[]cluster.Chain{{Name: "a", Table: "audit", HashColumn: "Hash"}}, "Chains[0].HashColumn"},
		"three part":   {[]cluster.Chain{{Name: "a", Table: "db.schema.audit"}}, "Chains[0].Table"},
	} {
		err := cluster.Config{NodeID: "n", DB: db, Chains: tt.chains}.Validate()
		if !errors.Is(err, cluster.ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", name, err, tt.want)
		}
	}
	if err := (cluster.Config{NodeID: "n", DB: db, Chains: []cluster.Chain{{Name: "a", Table: "audit.events"}}}).Validate(); err != nil {
		t.Errorf("schema-qualified table: %v", err)
	}
	for name, cfg := range map[string]cluster.Config{
		"chains":  {NodeID: "n", Provider: &fakeProvider{}, Chains: []cluster.Chain{{Name: "a", Table: "audit"}}},
		"witness": {NodeID: "n", Provider: &fakeProvider{}, WitnessFile: filepath.Join(t.TempDir(), "w.json")},
	} {
		_, err := cluster.New(context.Background(), cfg)
		if !errors.Is(err, cluster.ErrInvalidConfig) || !strings.Contains(err.Error(), "ChainStore") {
			t.Errorf("%s with a provider that has no ChainStore: %v", name, err)
		}
	}
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

// The boot check reads a chain's mark, tip and rows in separate
// statements; a leader's AdvanceTip committing between them must not look
// like a rollback.
func TestBootCheckBesideAWritingLeader(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		db := tg.Open(t)
		table := createAuditTable(t, tg, db)
		// Long leases: a keeps leading through the contention of the
		// boots (SQLite serializes every write), and b never leads.
		long := func(c *cluster.Config) {
			withAudit(table)(c)
			c.LeaseTTL, c.HeartbeatInterval, c.FenceTimeout = 20*time.Second, time.Second, 15*time.Second
		}
		a := startOn(t, tg, db, "a", long)
		wctx, stop := context.WithCancel(ctx)
		written := make(chan int, 1)
		go func() {
			i := 1
			for ; wctx.Err() == nil; i++ {
				if err := auditRow(wctx, tg, a, table, i, "a"); err != nil {
					if wctx.Err() == nil {
						t.Errorf("row %d: %v", i, err)
					}
					break
				}
				if tg.Dialect == cluster.SQLite {
					// The file has one writer at a time: leave the boots a turn.
					time.Sleep(2 * time.Millisecond)
				}
			}
			written <- i - 1
		}()
		least := 10
		if tg.Dialect == cluster.SQLite {
			least = 3 // every write waits for the file's one writer: boots are slow, and cannot interleave
		}
		began := time.Now()
		boots := 0
		for ; (time.Since(began) < 2*time.Second || boots < least) && time.Since(began) < 20*time.Second; boots++ {
			cfg := tg.Config(t, db, "b")
			long(&cfg)
			c, err := cluster.New(ctx, cfg)
			if err != nil {
				t.Errorf("New beside a writing leader (boot %d): %v", boots, err)
				break
			}
			c.Shutdown(ctx)
		}
		stop()
		rows := <-written
		t.Logf("%d boots beside %d rows written", boots, rows)
		if rows < 10 || boots < least {
			t.Fatalf("%d boots beside %d rows: too few to test anything", boots, rows)
		}
	})
}
