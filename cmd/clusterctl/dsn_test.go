package main

import (
	"strings"
	"testing"

	"github.com/sqlfence/cluster"
)

func TestInferDialect(t *testing.T) {
	for dsn, want := range map[string]cluster.Dialect{
		"postgres://app@db.internal/app":                           cluster.Postgres,
		"postgresql://app:pw@db.internal:5432/app?sslmode=require": cluster.Postgres,
		"POSTGRES://app@db/app":                                    cluster.Postgres,
		"file:/var/lib/app/cluster.db?_pragma=busy_timeout(5000)":  cluster.SQLite,
		"file:cluster?mode=ro":                                     cluster.SQLite,
		"/var/lib/app/cluster.db":                                  cluster.SQLite,
		"app.sqlite":                                               cluster.SQLite,
		"data/app.sqlite3?_txlock=immediate":                       cluster.SQLite,
		"root@tcp(127.0.0.1:3306)/test":                            cluster.MySQL,
		"app:p@ss/w0rd@tcp(db.internal:3306)/app?tls=true":         cluster.MySQL,
		"app:pw@unix(/run/mysqld/mysqld.sock)/app":                 cluster.MySQL,
		"app:pw@/app":                                              cluster.MySQL,
		"db.internal:5432":                                         "",
		"host=db user=app dbname=app":                              "",
		"":                                                         "",
	} {
		if got := inferDialect(dsn); got != want {
			t.Errorf("inferDialect(%q) = %q, want %q", dsn, got, want)
		}
	}
}

func TestSQLitePath(t *testing.T) {
	for dsn, want := range map[string]string{
		"file:/var/lib/app/cluster.db?_pragma=busy_timeout(5000)": "/var/lib/app/cluster.db",
		"file:///var/lib/app/cluster.db":                          "/var/lib/app/cluster.db",
		"file://localhost/var/lib/app/cluster.db":                 "/var/lib/app/cluster.db",
		"file:my%20app.db":                                        "my app.db",
		"/var/lib/app/cluster.db":                                 "/var/lib/app/cluster.db",
		"file::memory:?cache=shared":                              "",
		":memory:":                                                "",
		"file:x.db?mode=memory":                                   "",
	} {
		if got := sqlitePath(dsn); got != want {
			t.Errorf("sqlitePath(%q) = %q, want %q", dsn, got, want)
		}
	}
	for dsn, want := range map[string]string{
		"file:/x.db":                           "file:/x.db?_pragma=busy_timeout(5000)",
		"file:/x.db?_txlock=immediate":         "file:/x.db?_txlock=immediate&_pragma=busy_timeout(5000)",
		"file:/x.db?_pragma=busy_timeout(100)": "file:/x.db?_pragma=busy_timeout(100)",
	} {
		if got := withBusyTimeout(dsn); got != want {
			t.Errorf("withBusyTimeout(%q) = %q, want %q", dsn, got, want)
		}
	}
}

// Whatever the DSN's shape, and however mistyped, its password does not
// survive redact, even where a driver quotes the DSN whole.
func TestRedact(t *testing.T) {
	for _, tc := range []struct{ dsn, password string }{
		{"postgres://app:s3cret@db.internal:5432/app", "s3cret"},
		{"postgres://app:s3c%40ret@db.internal/app", "s3c@ret"},
		{"postgres://app:s3c@ret@db.internal/app", "s3c@ret"},
		{"postgres://app:s3cret@db.internal:port/app", "s3cret"},
		{"postgres://app:s3cret@[::1/app", "s3cret"},
		{"host=db user=app password=s3cret dbname=app", "s3cret"},
		{"host=db user=app password='s3 cret' dbname=app", "s3 cret"},
		{"app:s3cret@tcp(db.internal:3306)/app", "s3cret"},
		{"app:s3c@ret@tcp(db.internal:3306)/app", "s3c@ret"},
		{"app:s3cret@tcp(db.internal:3306", "s3cret"},
		{"app:s3c:ret@/app", "s3c:ret"},
	} {
		msg := "connect: parse \"" + tc.dsn + "\": failed\nfor password " + tc.password
		got := redact(msg, secrets(tc.dsn))
		if strings.Contains(got, tc.password) || strings.Contains(got, "s3c") {
			t.Errorf("redact of an error quoting %q left the password: %q", tc.dsn, got)
		}
		if strings.Contains(got, "\n") {
			t.Errorf("redact left a newline: %q", got)
		}
	}
	if got := redact("a\n  b\tc", nil); got != "a b c" {
		t.Errorf("redact folded %q, want %q", got, "a b c")
	}
}
