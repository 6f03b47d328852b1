package cluster_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// longestSchemaSuffix reads the schema files for the longest identifier
// they build from the table prefix, {{prefix}} followed by [a-z0-9_]+, and
// returns what follows the prefix.
func longestSchemaSuffix(t testing.TB) string {
	t.Helper()
	files, err := filepath.Glob("schema/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("schema files: %v, %v", files, err)
	}
	longest := ""
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`\{\{prefix\}\}([a-z0-9_]+)`).FindAllSubmatch(b, -1) {
			if len(m[1]) > len(longest) {
				longest = string(m[1])
			}
		}
	}
	return longest
}

// splitSQL splits a schema file as the package does: a statement ends at a
// line that starts in column 0 and ends with ";".
func splitSQL(src string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.SplitAfter(src, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "--") || (trimmed == "" && cur.Len() == 0) {
			continue
		}
		cur.WriteString(line)
		if !strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "\t") && strings.HasSuffix(trimmed, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	return out
}
