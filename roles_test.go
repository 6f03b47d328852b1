package cluster_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/sqlfence/cluster/internal/testdb"
)

// mysqlRole creates a MySQL user with privs on the test database, dropped
// when the test ends, and returns a DSN for it.
func mysqlRole(t *testing.T, tg testdb.Target, privs string) string {
	t.Helper()
	db := tg.Open(t)
	ctx := context.Background()
	user := strings.TrimSuffix(tg.Prefix, "_") + "_app"
	var schema string
	if err := db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"CREATE USER '" + user + "'@'%' IDENTIFIED BY 'pw'",
		"GRANT " + privs + " ON `" + schema + "`.* TO '" + user + "'@'%'",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() { db.ExecContext(context.Background(), "DROP USER IF EXISTS '"+user+"'@'%'") })
	return testdb.WithUser(t, tg, user, "pw")
}

// postgresRole creates a PostgreSQL login role with privs on the test's
// tables, dropped when the test ends, and returns a DSN for it.
func postgresRole(t *testing.T, tg testdb.Target, db *sql.DB, privs string) string {
	t.Helper()
	ctx := context.Background()
	role := strings.TrimSuffix(tg.Prefix, "_") + "_app"
	rows, err := db.QueryContext(ctx, "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() AND table_name LIKE $1", tg.Prefix+"%")
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var n string
		rows.Scan(&n)
		tables = append(tables, n)
	}
	rows.Close()
	if _, err := db.ExecContext(ctx, "CREATE ROLE "+role+" LOGIN PASSWORD 'pw'"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		db.ExecContext(context.Background(), "DROP OWNED BY "+role)
		db.ExecContext(context.Background(), "DROP ROLE IF EXISTS "+role)
	})
	if _, err := db.ExecContext(ctx, "GRANT "+privs+" ON "+strings.Join(tables, ", ")+" TO "+role); err != nil {
		t.Fatal(err)
	}
	return testdb.WithUser(t, tg, role, "pw")
}
