package cluster_test

import (
	"database/sql"
	"testing"
	"time"

	"github.com/sqlfence/cluster/internal/testdb"
)

// leaseRow is the timing of the lease row.
type leaseRow struct{ renewed, expires int64 }

// readLease reads the timing of the lease row.
func readLease(t *testing.T, tg testdb.Target, db *sql.DB) leaseRow {
	t.Helper()
	var r leaseRow
	if err := db.QueryRow("SELECT renewed_at, expires_at FROM "+tg.Prefix+"lease").Scan(&r.renewed, &r.expires); err != nil {
		t.Fatal(err)
	}
	return r
}

// afterRenew returns just after the lease row was renewed.
func afterRenew(t *testing.T, tg testdb.Target, db *sql.DB) {
	t.Helper()
	before := readLease(t, tg, db)
	waitFor(t, 5*time.Second, "a renew", func() bool { return readLease(t, tg, db).renewed != before.renewed })
}
