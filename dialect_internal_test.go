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
