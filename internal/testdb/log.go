package testdb

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"
)

// Logger returns a logger that writes to t.Log until the test ends, and
// drops records after that.
func Logger(t testing.TB) *slog.Logger {
	h := &tHandler{t: t, mu: new(sync.Mutex), done: new(bool)}
	t.Cleanup(func() {
		h.mu.Lock()
		*h.done = true
		h.mu.Unlock()
	})
	return slog.New(h)
}

type tHandler struct {
	t     testing.TB
	mu    *sync.Mutex
	done  *bool
	attrs []slog.Attr
	group string
}

func (h *tHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *tHandler) Handle(_ context.Context, r slog.Record) error {
	var buf bytes.Buffer
	th := slog.NewTextHandler(&buf, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.String("t", r.Time.Format("15:04:05.000"))
			}
			return a
		},
	})
	var sh slog.Handler = th.WithAttrs(h.attrs)
	if h.group != "" {
		sh = sh.WithGroup(h.group)
	}
	sh.Handle(context.Background(), r)
	h.mu.Lock()
	defer h.mu.Unlock()
	if !*h.done {
		h.t.Log(buf.String())
	}
	return nil
}

func (h *tHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	return &c
}

func (h *tHandler) WithGroup(name string) slog.Handler {
	c := *h
	c.group = name
	return &c
}
