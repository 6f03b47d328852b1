package cluster

import (
	"context"
	"log/slog"
	"strings"
)

// readableHandler is the handler every Cluster logs through: it hands the
// application's handler records that read the same under any of them.
// slog's JSON handler writes a time.Duration as integer nanoseconds
// ("lease_ttl":3000000000) and a nil error as null, and the message of an
// errors.Join holds newlines, which break a line-per-record log.
type readableHandler struct{ h slog.Handler }

func (r readableHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return r.h.Enabled(ctx, l)
}

func (r readableHandler) Handle(ctx context.Context, rec slog.Record) error {
	out := slog.NewRecord(rec.Time, rec.Level, oneLine(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		if a, ok := readableAttr(a); ok {
			out.AddAttrs(a)
		}
		return true
	})
	return r.h.Handle(ctx, out)
}

func (r readableHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return readableHandler{r.h.WithAttrs(readableAttrs(attrs))}
}

func (r readableHandler) WithGroup(name string) slog.Handler {
	return readableHandler{r.h.WithGroup(name)}
}

// defaultLogger is slog.Default() through a readableHandler, for the
// records logged where no Config names a Logger.
func defaultLogger() *slog.Logger { return slog.New(readableHandler{slog.Default().Handler()}) }

// readableAttr rewrites a: a duration as its text, an error as its
// message on one line; ok is false for an attribute with no value.
func readableAttr(a slog.Attr) (slog.Attr, bool) {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindDuration:
		return slog.String(a.Key, v.Duration().String()), true
	case slog.KindString:
		return slog.String(a.Key, oneLine(v.String())), true
	case slog.KindGroup:
		return slog.Attr{Key: a.Key, Value: slog.GroupValue(readableAttrs(v.Group())...)}, true
	case slog.KindAny:
		switch x := v.Any().(type) {
		case nil:
			return a, false
		case error:
			return slog.String(a.Key, oneLine(x.Error())), true
		}
	}
	return slog.Attr{Key: a.Key, Value: v}, true
}

func readableAttrs(as []slog.Attr) []slog.Attr {
	out := make([]slog.Attr, 0, len(as))
	for _, a := range as {
		if a, ok := readableAttr(a); ok {
			out = append(out, a)
		}
	}
	return out
}

// oneLine joins the lines of s with "; " (errors.Join separates its
// errors with newlines).
func oneLine(s string) string {
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	return strings.Join(strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' }), "; ")
}
