package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"time"
)

// leaderJSON is the leader as -json prints it: the discovery handler's
// fields (leaseExpiresAt in unix milliseconds by the database clock) and
// the time left by that clock.
type leaderJSON struct {
	NodeID         string  `json:"nodeId"`
	Endpoint       *string `json:"endpoint"`
	FencingToken   uint64  `json:"fencingToken"`
	LeaseExpiresAt int64   `json:"leaseExpiresAt"`
	RemainingMs    int64   `json:"remainingMs"`
}

// statusJSON is what status -json prints. FencingToken is the lease row's:
// the leader's while one leads, else the last one granted (0: never).
type statusJSON struct {
	Lease         string       `json:"lease"`
	Leader        *leaderJSON  `json:"leader"`
	FencingToken  uint64       `json:"fencingToken"`
	NodeTimeoutMs int64        `json:"nodeTimeoutMs"`
	Members       []memberJSON `json:"members"`
}

// membersOutput is what members -json prints.
type membersOutput struct {
	Lease         string       `json:"lease"`
	NodeTimeoutMs int64        `json:"nodeTimeoutMs"`
	Members       []memberJSON `json:"members"`
}

func runStatus(ctx context.Context, e *env) error {
	ctx, cancel := e.bounded(ctx)
	defer cancel()
	if err := e.connect(ctx, false); err != nil {
		return err
	}
	name := e.opts.lease
	l, err := e.p.Leader(ctx, name)
	if err != nil {
		return err
	}
	token, err := e.p.LeaseToken(ctx, name)
	if err != nil {
		return err
	}
	ms, err := e.p.Members(ctx, name, e.opts.nodeTimeout)
	if err != nil {
		return err
	}
	now, err := e.now(ctx)
	if err != nil {
		return err
	}

	if e.opts.json {
		out := statusJSON{Lease: name, FencingToken: token, NodeTimeoutMs: e.opts.nodeTimeout.Milliseconds(), Members: e.membersJSON(ms)}
		if l != nil {
			out.Leader = &leaderJSON{NodeID: l.NodeID, FencingToken: l.FencingToken,
				LeaseExpiresAt: l.LeaseExpiresAt.UnixMilli(), RemainingMs: max(l.LeaseExpiresAt.Sub(now), 0).Milliseconds()}
			if l.Endpoint != "" {
				out.Leader.Endpoint = &l.Endpoint
			}
		}
		return e.printJSON(out)
	}

	w := e.table()
	fmt.Fprintf(w, "lease\t%s\n", name)
	switch {
	case l != nil:
		fmt.Fprintf(w, "leader\t%s\n", l.NodeID)
		fmt.Fprintf(w, "endpoint\t%s\n", orDash(l.Endpoint))
		fmt.Fprintf(w, "token\t%d\n", l.FencingToken)
		fmt.Fprintf(w, "expires\t%s (in %s, by the database clock)\n", stamp(l.LeaseExpiresAt), span(max(l.LeaseExpiresAt.Sub(now), 0)))
	case token == 0:
		fmt.Fprintf(w, "leader\tnone: the lease was never acquired\n")
	default:
		fmt.Fprintf(w, "leader\tnone: the lease is free\n")
		fmt.Fprintf(w, "token\t%d (the last granted; the next term gets %d)\n", token, token+1)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout)
	return e.printMembers(ms)
}

func runMembers(ctx context.Context, e *env) error {
	ctx, cancel := e.bounded(ctx)
	defer cancel()
	if err := e.connect(ctx, false); err != nil {
		return err
	}
	ms, err := e.p.Members(ctx, e.opts.lease, e.opts.nodeTimeout)
	if err != nil {
		return err
	}
	if e.opts.json {
		return e.printJSON(membersOutput{Lease: e.opts.lease, NodeTimeoutMs: e.opts.nodeTimeout.Milliseconds(), Members: e.membersJSON(ms)})
	}
	return e.printMembers(ms)
}

// tipJSON is a chain tip as -json prints it; hash is hex.
type tipJSON struct {
	Chain        string `json:"chain"`
	Lease        string `json:"lease"`
	Counter      uint64 `json:"counter"`
	FencingToken uint64 `json:"fencingToken"`
	Hash         string `json:"hash"`
}

type tipsOutput struct {
	Tips []tipJSON `json:"tips"`
}

func runTips(ctx context.Context, e *env) error {
	ctx, cancel := e.bounded(ctx)
	defer cancel()
	if err := e.connect(ctx, false); err != nil {
		return err
	}
	tips, err := e.p.Tips(ctx)
	if err != nil {
		return err
	}
	if e.opts.json {
		out := tipsOutput{Tips: make([]tipJSON, 0, len(tips))}
		for _, t := range tips {
			out.Tips = append(out.Tips, tipJSON{Chain: t.Chain, Lease: t.Lease, Counter: t.Counter, FencingToken: t.FencingToken, Hash: hex.EncodeToString(t.Hash)})
		}
		return e.printJSON(out)
	}
	if len(tips) == 0 {
		_, err := fmt.Fprintln(e.stdout, "no chain tips recorded")
		return err
	}
	w := e.table()
	fmt.Fprintln(w, "CHAIN\tLEASE\tCOUNTER\tTOKEN\tHASH")
	for _, t := range tips {
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\n", t.Chain, t.Lease, t.Counter, t.FencingToken, prefix(hex.EncodeToString(t.Hash), 16))
	}
	return w.Flush()
}

// fingerprintJSON is the recorded vault-key fingerprint as -json prints
// it: the first 16 hex characters, as the library logs it.
type fingerprintJSON struct {
	Prefix        string    `json:"prefix"`
	RotationEpoch uint64    `json:"rotationEpoch"`
	RecordedBy    string    `json:"recordedBy"`
	RecordedAt    time.Time `json:"recordedAt"` // by the database clock
}

// fingerprintOutput is what fingerprint -json prints; Fingerprint is null
// when none is recorded.
type fingerprintOutput struct {
	Lease       string           `json:"lease"`
	Fingerprint *fingerprintJSON `json:"fingerprint"`
}

func runFingerprint(ctx context.Context, e *env) error {
	ctx, cancel := e.bounded(ctx)
	defer cancel()
	if err := e.connect(ctx, false); err != nil {
		return err
	}
	st, ok, err := e.p.ReadVaultState(ctx, e.opts.lease)
	if err != nil {
		return err
	}
	out := fingerprintOutput{Lease: e.opts.lease}
	if ok {
		out.Fingerprint = &fingerprintJSON{Prefix: prefix(st.Fingerprint, 16), RotationEpoch: st.RotationEpoch,
			RecordedBy: st.RecordedBy, RecordedAt: st.RecordedAt.UTC()}
	}
	if e.opts.json {
		return e.printJSON(out)
	}
	w := e.table()
	fmt.Fprintf(w, "lease\t%s\n", e.opts.lease)
	if !ok {
		fmt.Fprintf(w, "fingerprint\tnone recorded\n")
		return w.Flush()
	}
	fmt.Fprintf(w, "fingerprint\t%s…\n", out.Fingerprint.Prefix)
	fmt.Fprintf(w, "rotation epoch\t%d\n", st.RotationEpoch)
	fmt.Fprintf(w, "recorded by\t%s\n", st.RecordedBy)
	fmt.Fprintf(w, "recorded at\t%s (by the database clock)\n", stamp(st.RecordedAt))
	return w.Flush()
}

// laneJSON is a lane as lanes -json prints it: times in unix milliseconds
// by the database clock. A free lane (held false, remainingMs 0) names its
// last holder, or none if it was never claimed, and keeps its token.
type laneJSON struct {
	Lane         string `json:"lane"`
	Held         bool   `json:"held"`
	Holder       string `json:"holder"`
	Instance     string `json:"instance"`
	FencingToken uint64 `json:"fencingToken"`
	AcquiredAt   int64  `json:"acquiredAt"`
	ExpiresAt    int64  `json:"expiresAt"`
	RemainingMs  int64  `json:"remainingMs"`
}

// lanesOutput is what lanes -json prints.
type lanesOutput struct {
	Lease string     `json:"lease"`
	Lanes []laneJSON `json:"lanes"`
}

func runLanes(ctx context.Context, e *env) error {
	ctx, cancel := e.bounded(ctx)
	defer cancel()
	if err := e.connect(ctx, false); err != nil {
		return err
	}
	lanes, err := e.p.ListLanes(ctx, e.opts.lease)
	if err != nil {
		return err
	}
	if e.opts.json {
		out := lanesOutput{Lease: e.opts.lease, Lanes: make([]laneJSON, 0, len(lanes))}
		for _, l := range lanes {
			out.Lanes = append(out.Lanes, laneJSON{Lane: l.Key, Held: l.Remaining > 0, Holder: l.Holder, Instance: l.Instance,
				FencingToken: l.FencingToken, AcquiredAt: l.AcquiredAt.UnixMilli(), ExpiresAt: l.ExpiresAt.UnixMilli(),
				RemainingMs: max(l.Remaining, 0).Milliseconds()})
		}
		return e.printJSON(out)
	}
	if len(lanes) == 0 {
		_, err := fmt.Fprintf(e.stdout, "no lanes of lease %q recorded\n", e.opts.lease)
		return err
	}
	w := e.table()
	fmt.Fprintln(w, "LANE\tHOLDER\tINSTANCE\tTOKEN\tEXPIRES\tLEFT")
	for _, l := range lanes {
		if l.Remaining <= 0 {
			fmt.Fprintf(w, "%s\t-\t-\t%d\t-\tfree\n", l.Key, l.FencingToken)
			continue
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\n", l.Key, l.Holder, prefix(l.Instance, 8), l.FencingToken, stamp(l.ExpiresAt), span(l.Remaining))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	_, err = fmt.Fprintln(e.stdout, "(expiry by the database clock; a free lane keeps its token, and its next claim gets a higher one)")
	return err
}
