package cluster

import (
	"slices"
	"testing"
)

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
