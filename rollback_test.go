package cluster_test

import (
	"context"
	"errors"
	"io"
	"os"
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
