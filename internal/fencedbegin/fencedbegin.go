// Package fencedbegin carries cluster.BeginFenced's request, through
// database/sql's BeginTx, to the driver connection that begins the
// transaction: a connection that can fence the transaction as it begins
// it (clusterpgx's, which sends the BEGIN and the fence in one batch)
// does, and says so in the request; any other begins a plain one, which
// BeginFenced then fences with a statement of its own.
package fencedbegin

import "context"

// A Request asks the connection that begins a transaction to fence it
// too, and holds its answer.
type Request struct {
	// Fencer is the *cluster.Cluster to fence with (cluster.Default() for
	// the default instance).
	Fencer any
	// Fenced is set by a connection that began the transaction and fenced
	// it; Token is then the fencing token it verified.
	Fenced bool
	Token  uint64
}

type key struct{}

// With returns ctx carrying r; a nil r hides a request ctx carries, for
// a transaction begun inside the handling of one.
func With(ctx context.Context, r *Request) context.Context {
	return context.WithValue(ctx, key{}, r)
}

// From returns the request ctx carries, or nil.
func From(ctx context.Context) *Request {
	r, _ := ctx.Value(key{}).(*Request)
	return r
}
