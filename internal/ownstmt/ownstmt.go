// Package ownstmt marks the context of the statements a DBProvider makes
// on its own account over a database/sql pool (lease, membership, lanes),
// for a connector that can treat them differently. clusterpgx.OpenDB's
// connections skip pgx's liveness ping before them: a listening follower
// makes one statement per lease TTL on a connection idle since the last,
// and the ping would double what it costs the server. The provider needs
// no ping: a statement that fails on a dead connection is retried at its
// next step, on another connection, as any failed statement is.
package ownstmt

import (
	"context"
	"time"
)

type key struct{}

// With returns ctx marked as the context of a provider's own statement.
func With(ctx context.Context) context.Context { return context.WithValue(ctx, key{}, true) }

// Is reports whether ctx carries the mark.
func Is(ctx context.Context) bool {
	v, _ := ctx.Value(key{}).(bool)
	return v
}

// ShouldPing is pgx's rule for a liveness ping (a connection idle for
// over a second), except in a marked context: the one rule of
// clusterpgx's pools, pgxpool's and database/sql's alike.
func ShouldPing(ctx context.Context, idle time.Duration) bool {
	return !Is(ctx) && idle > time.Second
}
