package main

import (
	"context"
	"database/sql"
	"testing"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// createAuditTable creates <prefix>audit, a hash-chained table with the
// library's default column names (dropped with the target's tables).
func createAuditTable(t *testing.T, tg testdb.Target, db *sql.DB) string {
	t.Helper()
	name := tg.Prefix + "audit"
	ddl := map[cluster.Dialect]string{
		cluster.Postgres: "CREATE TABLE " + name + " (monotonic_counter BIGINT PRIMARY KEY, row_hash BYTEA NOT NULL)",
		cluster.MySQL:    "CREATE TABLE " + name + " (monotonic_counter BIGINT PRIMARY KEY, row_hash VARBINARY(64) NOT NULL) ENGINE=InnoDB",
		cluster.SQLite:   "CREATE TABLE " + name + " (monotonic_counter INTEGER PRIMARY KEY, row_hash BLOB NOT NULL)",
	}[tg.Dialect]
	if _, err := db.ExecContext(context.Background(), ddl); err != nil {
		t.Fatal(err)
	}
	return name
}

// rowHash is a stand-in hash of audit row n.
func rowHash(n int) []byte {
	return []byte{0xa0, byte(n >> 8), byte(n), 0xfe, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06}
}

// appendAudit appends rows from..to to the audit table, each in a
// transaction fenced by c that advances the tip of chain "audit".
func appendAudit(t *testing.T, tg testdb.Target, c *cluster.Cluster, db *sql.DB, table string, from, to int) {
	t.Helper()
	ctx := context.Background()
	insert := "INSERT INTO " + table + " (monotonic_counter, row_hash) VALUES (?, ?)"
	if tg.Dialect == cluster.Postgres {
		insert = "INSERT INTO " + table + " (monotonic_counter, row_hash) VALUES ($1, $2)"
	}
	for i := from; i <= to; i++ {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Fence(ctx, tx); err != nil {
			tx.Rollback()
			t.Fatalf("Fence: %v", err)
		}
		if _, err := tx.ExecContext(ctx, insert, i, rowHash(i)); err != nil {
			tx.Rollback()
			t.Fatal(err)
		}
		if err := c.AdvanceTip(ctx, tx, "audit", uint64(i), rowHash(i)); err != nil {
			tx.Rollback()
			t.Fatalf("AdvanceTip(%d): %v", i, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
}
