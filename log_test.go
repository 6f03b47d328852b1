package cluster_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
)

// logRecorder keeps the messages of the records logged through it.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *logRecorder) logger(next *slog.Logger) *slog.Logger {
	return slog.New(recordingHandler{r: r, next: next.Handler()})
}

func (r *logRecorder) add(msg string) {
	r.mu.Lock()
	r.msgs = append(r.msgs, msg)
	r.mu.Unlock()
}

func (r *logRecorder) has(part string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.msgs {
		if strings.Contains(m, part) {
			return true
		}
	}
	return false
}

type recordingHandler struct {
	r    *logRecorder
	next slog.Handler
}

func (h recordingHandler) Enabled(ctx context.Context, l slog.Level) bool { return true }

func (h recordingHandler) Handle(ctx context.Context, rec slog.Record) error {
	h.r.add(rec.Message)
	return h.next.Handle(ctx, rec)
}

func (h recordingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return recordingHandler{r: h.r, next: h.next.WithAttrs(as)}
}

func (h recordingHandler) WithGroup(name string) slog.Handler {
	return recordingHandler{r: h.r, next: h.next.WithGroup(name)}
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
