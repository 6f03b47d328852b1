package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// Under the JSON and the text handler alike, a record is one line, a
// duration is its text, a joined error is one line, and a nil error is
// left out, in a record's attributes, in a logger's (With) and in groups.
func TestReadableHandler(t *testing.T) {
	joined := errors.Join(errors.New("renew failed"), errors.New("release failed"))
	for name, mk := range map[string]func(*bytes.Buffer) slog.Handler{
		"json": func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) },
		"text": func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) },
	} {
		var buf bytes.Buffer
		log := slog.New(readableHandler{mk(&buf)}).With("lease_ttl", 3*time.Second, "none", nil)
		var noErr error
		log.Warn("cluster: self-fenced\nsecond line", "err", noErr, "cause", joined,
			"took", 1500*time.Millisecond, slog.Group("g", "wait", time.Second))
		out := buf.String()
		if strings.Count(out, "\n") != 1 {
			t.Errorf("%s: the record spans %d lines: %q", name, strings.Count(out, "\n"), out)
		}
		for _, want := range []string{"3s", "1.5s", "renew failed; release failed", "self-fenced; second line"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: %q lacks %q", name, out, want)
			}
		}
		for _, bad := range []string{"3000000000", "null", "err=", `"err"`, "none", "<nil>"} {
			if strings.Contains(out, bad) {
				t.Errorf("%s: %q holds %q", name, out, bad)
			}
		}
		if name == "json" {
			var rec map[string]any
			if err := json.Unmarshal([]byte(out), &rec); err != nil {
				t.Fatalf("json: %v in %q", err, out)
			}
			if rec["lease_ttl"] != "3s" || rec["took"] != "1.5s" || rec["g"].(map[string]any)["wait"] != "1s" {
				t.Errorf("json: durations %v, %v, %v; want \"3s\", \"1.5s\", \"1s\"", rec["lease_ttl"], rec["took"], rec["g"])
			}
		}
	}
}
