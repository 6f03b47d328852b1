package cluster

import (
	"slices"
	"strings"
	"testing"
)

// Every dialect defines every query its type needs, and nothing else.
func TestDialectQueriesLoad(t *testing.T) {
	for d := range dialects {
		t.Run(string(d), func(t *testing.T) {
			dl, err := newDialect(d, DefaultTablePrefix)
			if err != nil {
				t.Fatal(err)
			}
			if dl.name() != d {
				t.Fatalf("dialect %q names itself %q", d, dl.name())
			}
			// PostgreSQL's calls a function of the schema, the others
			// name the table.
			if q := dl.queries().Acquire; !strings.Contains(q, DefaultTablePrefix+"lease") && !strings.Contains(q, DefaultTablePrefix+"acquire(") ||
				strings.Contains(q, "{{prefix}}") {
				t.Fatalf("acquire query names no prefixed table or function: %s", q)
			}
		})
	}
}

// A queries file that lacks a name, or has one no field takes, fails at
// load.
func TestLoadQueriesFailsLoudly(t *testing.T) {
	var q struct {
		A string `sql:"a"`
		B string `sql:"b"`
	}
	mustPanic := func(what, src, want string) {
		t.Helper()
		defer func() {
			r := recover()
			if r == nil || !strings.Contains(r.(string), want) {
				t.Errorf("%s: panic %v, want one naming %q", what, r, want)
			}
		}()
		loadQueries("test.sql", src, &q)
	}
	mustPanic("missing", "-- name: a\nSELECT 1;\n", `query "b"`)
	mustPanic("unused", "-- name: a\nSELECT 1;\n-- name: b\nSELECT 2;\n-- name: c\nSELECT 3;\n", `"c", which nothing uses`)
	loadQueries("test.sql", "-- name: a\nSELECT 1;\n-- name: b\n-- args: x.\nSELECT 2;\n", &q)
	if q.A != "SELECT 1" || q.B != "SELECT 2" {
		t.Fatalf("loaded %+v", q)
	}
}

// A schema file's last statement counts even when its final line is
// indented (a CREATE TRIGGER ... EXECUTE FUNCTION f(); at the end).
func TestSplitStatementsKeepsTheLast(t *testing.T) {
	src := "CREATE TABLE a (x INT);\n\n-- a comment\nCREATE TRIGGER t\n    BEFORE TRUNCATE ON a\n    FOR EACH STATEMENT EXECUTE FUNCTION f();\n"
	want := []string{"CREATE TABLE a (x INT)", "CREATE TRIGGER t\n    BEFORE TRUNCATE ON a\n    FOR EACH STATEMENT EXECUTE FUNCTION f()"}
	if got := splitStatements(src); !slices.Equal(got, want) {
		t.Fatalf("splitStatements = %q, want %q", got, want)
	}
	if got := splitStatements("SELECT 1;\n\n-- trailing comment\n"); !slices.Equal(got, []string{"SELECT 1"}) {
		t.Fatalf("splitStatements with a trailing comment = %q", got)
	}
}

// sqlState is an error with a PostgreSQL SQLSTATE, as pgconn.PgError has.
type sqlState string

func (s sqlState) Error() string    { return "SQLSTATE " + string(s) }
func (s sqlState) SQLState() string { return string(s) }

// Each PostgreSQL error the hints name gets the hint of its own cause: a
// statement that went missing and one that already exists are two
// different faults of a transaction pooler, with two different fixes.
func TestPostgresHints(t *testing.T) {
	d := &postgres{}
	for code, want := range map[string]string{
		"26000": "went missing",
		"42P05": "already exists",
		"42501": "permission denied",
		"25006": "read-only replica",
	} {
		_, hint, _ := d.classify(sqlState(code))
		if !strings.Contains(hint, want) {
			t.Errorf("hint for %s = %q, want it to say %q", code, hint, want)
		}
	}
	if _, hint, _ := d.classify(sqlState("42P05")); strings.Contains(hint, "went missing") {
		t.Errorf("hint for 42P05 (already exists) blames a missing statement: %q", hint)
	}
}
