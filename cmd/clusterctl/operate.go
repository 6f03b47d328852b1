package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/sqlfence/cluster"
)

// confirm asks question on stderr and reads the answer from stdin; only
// y or yes proceeds.
func (e *env) confirm(question string) (bool, error) {
	fmt.Fprintf(e.stderr, "%s [y/N] ", question)
	line, err := e.stdin.ReadString('\n')
	if err != nil && (line == "" || !errors.Is(err, io.EOF)) {
		fmt.Fprintln(e.stderr)
		return false, errors.New("no answer on stdin: answer y, or pass -yes to proceed without asking")
	}
	a := strings.ToLower(strings.TrimSpace(line))
	return a == "y" || a == "yes", nil
}

// releaseJSON is what release -json prints: whether a term was ended, and
// whose.
type releaseJSON struct {
	Lease        string `json:"lease"`
	Released     bool   `json:"released"`
	NodeID       string `json:"nodeId,omitempty"`
	FencingToken uint64 `json:"fencingToken,omitempty"`
}

func runRelease(ctx context.Context, e *env) error {
	if e.opts.lane != "" {
		return runReleaseLane(ctx, e)
	}
	if !e.opts.force {
		return usagef("refusing to release lease %q without -force: it ends the current term at once, the leader's work stops "+
			"and another node takes over; run clusterctl release -force (-yes skips the question)", e.opts.lease)
	}
	name := e.opts.lease
	bctx, cancel := e.bounded(ctx)
	defer cancel()
	if err := e.connect(bctx, false); err != nil {
		return err
	}
	l, err := e.p.Leader(bctx, name)
	if err != nil {
		return err
	}
	if l == nil {
		return e.reportRelease(releaseJSON{Lease: name})
	}
	if !e.opts.yes {
		ok, err := e.confirm(fmt.Sprintf("Expire lease %q held by node %q (token %d)?", name, l.NodeID, l.FencingToken))
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("lease %q not released: not confirmed", name)
		}
		bctx, cancel = e.bounded(ctx) // the answer took a while
		defer cancel()
	}
	// The database ends the term read above and no other: one that
	// changed hands meanwhile (a resign, a takeover) is left alone.
	released, err := e.p.ForceRelease(bctx, name, l.FencingToken)
	if held := (*cluster.LeaseHeldError)(nil); errors.As(err, &held) {
		return fmt.Errorf("lease %q changed hands since it was read: it is now held by node %q (token %d), not node %q (token %d); nothing released, run clusterctl release again",
			name, held.Holder, held.FencingToken, l.NodeID, l.FencingToken)
	}
	if err != nil {
		return err
	}
	if !released {
		return e.reportRelease(releaseJSON{Lease: name})
	}
	return e.reportRelease(releaseJSON{Lease: name, Released: true, NodeID: l.NodeID, FencingToken: l.FencingToken})
}

func (e *env) reportRelease(r releaseJSON) error {
	if e.opts.json {
		return e.printJSON(r)
	}
	if !r.Released {
		_, err := fmt.Fprintf(e.stdout, "lease %q is not held: no term to end\n", r.Lease)
		return err
	}
	_, err := fmt.Fprintf(e.stdout, "released lease %q: the term of node %q (token %d) ended by the database clock; "+
		"fenced writes under token %d are refused from now on, and the next term gets a higher token\n",
		r.Lease, r.NodeID, r.FencingToken, r.FencingToken)
	return err
}

// releaseLaneJSON is what release -lane -json prints: whether a claim was
// ended, and whose.
type releaseLaneJSON struct {
	Lease        string `json:"lease"`
	Lane         string `json:"lane"`
	Released     bool   `json:"released"`
	NodeID       string `json:"nodeId,omitempty"`
	FencingToken uint64 `json:"fencingToken,omitempty"`
}

func runReleaseLane(ctx context.Context, e *env) error {
	name, key := e.opts.lease, e.opts.lane
	if !e.opts.force {
		return usagef("refusing to release lane %q of lease %q without -force: it ends the current claim at once, and another node may "+
			"claim the lane; run clusterctl release -lane %s -force (-yes skips the question)", key, name, key)
	}
	bctx, cancel := e.bounded(ctx)
	defer cancel()
	if err := e.connect(bctx, false); err != nil {
		return err
	}
	read := func(ctx context.Context) (*cluster.Lane, error) {
		l, err := e.p.ReadLane(ctx, name, key)
		if err != nil || l == nil || l.Remaining <= 0 {
			return nil, err
		}
		return l, nil
	}
	l, err := read(bctx)
	if err != nil {
		return err
	}
	if l == nil {
		return e.reportReleaseLane(releaseLaneJSON{Lease: name, Lane: key})
	}
	if !e.opts.yes {
		ok, err := e.confirm(fmt.Sprintf("End the claim on lane %q of lease %q held by node %q (token %d)?", key, name, l.Holder, l.FencingToken))
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("lane %q not released: not confirmed", key)
		}
		bctx, cancel = e.bounded(ctx) // the answer took a while
		defer cancel()
	}
	// The database ends the claim read above and no other.
	released, err := e.p.ForceReleaseLane(bctx, name, key, l.FencingToken)
	if held := (*cluster.LaneHeldError)(nil); errors.As(err, &held) {
		return fmt.Errorf("lane %q changed hands since it was read: it is now held by node %q (token %d), not node %q (token %d); nothing released, run clusterctl release -lane again",
			key, held.Holder, held.FencingToken, l.Holder, l.FencingToken)
	}
	if err != nil {
		return err
	}
	if !released {
		return e.reportReleaseLane(releaseLaneJSON{Lease: name, Lane: key})
	}
	return e.reportReleaseLane(releaseLaneJSON{Lease: name, Lane: key, Released: true, NodeID: l.Holder, FencingToken: l.FencingToken})
}

func (e *env) reportReleaseLane(r releaseLaneJSON) error {
	if e.opts.json {
		return e.printJSON(r)
	}
	if !r.Released {
		_, err := fmt.Fprintf(e.stdout, "lane %q of lease %q is not held: no claim to end\n", r.Lane, r.Lease)
		return err
	}
	_, err := fmt.Fprintf(e.stdout, "released lane %q of lease %q: the claim of node %q (token %d) ended by the database clock; "+
		"the next claim gets a higher token\n", r.Lane, r.Lease, r.NodeID, r.FencingToken)
	return err
}

// retireJSON is what retire -json prints; FencingToken is the token the
// row keeps (the next term of this name gets a higher one).
type retireJSON struct {
	Lease        string `json:"lease"`
	Retired      bool   `json:"retired"`
	FencingToken uint64 `json:"fencingToken"`
}

func runRetire(ctx context.Context, e *env) error {
	name := e.opts.lease
	bctx, cancel := e.bounded(ctx)
	defer cancel()
	if err := e.connect(bctx, false); err != nil {
		return err
	}
	held := func(l *cluster.Leader) error {
		return fmt.Errorf("lease %q is held by node %q (token %d): stop its nodes first (a released lease is taken again within a heartbeat)",
			name, l.NodeID, l.FencingToken)
	}
	l, err := e.p.Leader(bctx, name)
	if err != nil {
		return err
	}
	if l != nil {
		return held(l)
	}
	token, err := e.p.LeaseToken(bctx, name)
	if err != nil {
		return err
	}
	if !e.opts.yes {
		ok, err := e.confirm(fmt.Sprintf("Retire lease %q (fencing token %d is kept; its members are marked left)?", name, token))
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("lease %q not retired: not confirmed", name)
		}
		bctx, cancel = e.bounded(ctx)
		defer cancel()
	}
	if err := e.p.Retire(bctx, name); err != nil {
		if errors.Is(err, cluster.ErrLeaseHeld) {
			if l, lerr := e.p.Leader(bctx, name); lerr == nil && l != nil {
				return held(l)
			}
		}
		return err
	}
	// A node may have acquired and released it meanwhile: report the
	// token the row keeps now.
	if t, err := e.p.LeaseToken(bctx, name); err == nil {
		token = t
	}
	if e.opts.json {
		return e.printJSON(retireJSON{Lease: name, Retired: true, FencingToken: token})
	}
	if token == 0 {
		_, err = fmt.Fprintf(e.stdout, "retired lease %q, which was never acquired: its members marked left\n", name)
		return err
	}
	_, err = fmt.Fprintf(e.stdout, "retired lease %q: no holder, its members marked left; fencing token %d kept, so its next term gets %d\n",
		name, token, token+1)
	return err
}

// migrateJSON is what migrate -json prints.
type migrateJSON struct {
	Dialect         cluster.Dialect `json:"dialect"`
	Prefix          string          `json:"prefix"`
	SchemaVersion   int64           `json:"schemaVersion"`
	PreviousVersion int64           `json:"previousVersion"` // 0: there were no tables
	Changed         bool            `json:"changed"`
}

func runMigrate(ctx context.Context, e *env) error {
	ctx, cancel := e.bounded(ctx)
	defer cancel()
	if err := e.connect(ctx, true); err != nil {
		return err
	}
	out := migrateJSON{Dialect: e.dialect, Prefix: e.opts.prefix, SchemaVersion: cluster.SchemaVersion, PreviousVersion: cluster.SchemaVersion}
	err := e.p.CheckSchema(ctx)
	switch {
	case errors.Is(err, cluster.ErrSchema):
		out.PreviousVersion, _ = e.schemaVersion(ctx)
		if out.PreviousVersion > cluster.SchemaVersion {
			return e.checkSchema(ctx) // says so
		}
		if err := e.p.Init(ctx); err != nil {
			return err
		}
		out.Changed = true
	case err != nil:
		return err
	}
	if e.opts.json {
		return e.printJSON(out)
	}
	switch {
	case !out.Changed:
		_, err = fmt.Fprintf(e.stdout, "the cluster tables (prefix %q) are at schema version %d already: nothing to do\n", out.Prefix, out.SchemaVersion)
	case out.PreviousVersion == 0:
		_, err = fmt.Fprintf(e.stdout, "created the cluster tables (prefix %q) at schema version %d\n", out.Prefix, out.SchemaVersion)
	default:
		_, err = fmt.Fprintf(e.stdout, "upgraded the cluster tables (prefix %q) from schema version %d to %d\n", out.Prefix, out.PreviousVersion, out.SchemaVersion)
	}
	return err
}

func runSchema(_ context.Context, e *env) error {
	if err := e.target(false); err != nil {
		return err
	}
	ddl, err := cluster.SchemaSQL(e.dialect, e.opts.prefix)
	if err != nil {
		return err
	}
	_, err = io.WriteString(e.stdout, ddl)
	return err
}

// forgetJSON is what forget -json prints.
type forgetJSON struct {
	Lease     string `json:"lease"`
	NodeID    string `json:"nodeId"`
	Forgotten int64  `json:"forgotten"` // membership rows removed
}

func runForget(ctx context.Context, e *env) error {
	name, node := e.opts.lease, e.opts.node
	bctx, cancel := e.bounded(ctx)
	defer cancel()
	if err := e.connect(bctx, false); err != nil {
		return err
	}
	ms, err := e.p.Members(bctx, name, e.opts.nodeTimeout)
	if err != nil {
		return err
	}
	rows := 0
	for _, m := range ms {
		if m.NodeID != node {
			continue
		}
		if m.Live {
			return fmt.Errorf("node %q is live (instance %s on %s, seen %v ago): stop it first, or wait until it goes unseen for -node-timeout (%v)",
				node, m.Instance, m.Host, m.SeenAgo.Round(time.Millisecond), e.opts.nodeTimeout)
		}
		rows++
	}
	if rows == 0 {
		return fmt.Errorf("node %q has no membership row in lease %q: nothing to forget (clusterctl members lists them)", node, name)
	}
	if !e.opts.yes {
		ok, err := e.confirm(fmt.Sprintf("Forget node %q of lease %q (%d membership row(s), none live)?", node, name, rows))
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("node %q not forgotten: not confirmed", node)
		}
		bctx, cancel = e.bounded(ctx)
		defer cancel()
	}
	n, err := e.p.Forget(bctx, name, node, e.opts.nodeTimeout)
	if err != nil {
		return err
	}
	if e.opts.json {
		return e.printJSON(forgetJSON{Lease: name, NodeID: node, Forgotten: n})
	}
	_, err = fmt.Fprintf(e.stdout, "forgot node %q of lease %q: %d membership row(s) removed\n", node, name, n)
	return err
}
