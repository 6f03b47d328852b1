package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
)

// DiscoveryHandler returns an http.Handler that tells load balancers and
// operators who leads. It answers every method (HEAD without a body) with
// Cache-Control: no-store and a JSON body:
//
//	{"leader":{"nodeId":"api-1","endpoint":"https://api-1.internal:8443",
//	           "fencingToken":42,"leaseExpiresAt":1767225600000},
//	 "self":{"nodeId":"api-2","endpoint":"https://api-2.internal:8443","isLeader":false}}
//
// The status is 200 when a node holds an unexpired lease, and 503 with
// "leader":null when none does or the lookup fails; a failed lookup adds
// "error":"leader lookup failed" and never the database's message, which is
// logged instead. leaseExpiresAt is unix milliseconds by the database clock;
// endpoints not configured are null. Concurrent requests share one database
// read.
//
// The handler has no authentication: mount it inside the trust boundary, or
// wrap it in your own middleware.
func (c *Cluster) DiscoveryHandler() http.Handler {
	if c.isDefault() {
		return DiscoveryHandler()
	}
	return http.HandlerFunc(c.serveDiscovery)
}

type discoverySelf struct {
	NodeID   string  `json:"nodeId"`
	Endpoint *string `json:"endpoint"`
	IsLeader bool    `json:"isLeader"`
}

type discoveryBody struct {
	Leader *Leader       `json:"leader"`
	Self   discoverySelf `json:"self"`
	Error  string        `json:"error,omitempty"`
}

func (c *Cluster) serveDiscovery(w http.ResponseWriter, r *http.Request) {
	body := discoveryBody{Self: discoverySelf{
		NodeID:   c.cfg.NodeID,
		Endpoint: optional(c.cfg.Endpoint),
		IsLeader: c.IsLeader(),
	}}
	l, err := c.CurrentLeader(r.Context())
	switch {
	case err != nil:
		body.Error = "leader lookup failed"
		// Load balancers poll often: warn when lookups start failing, not
		// on every request.
		level := slog.LevelDebug
		if !c.lookupFailing.Swap(true) {
			level = slog.LevelWarn
		}
		c.log.Log(r.Context(), level, "cluster: discovery: leader lookup failed", "err", err)
	case l != nil:
		body.Leader = l
	}
	if err == nil && c.lookupFailing.Swap(false) {
		c.log.InfoContext(r.Context(), "cluster: discovery: leader lookups succeed again")
	}
	writeDiscovery(w, r, body)
}

func writeDiscovery(w http.ResponseWriter, r *http.Request, body discoveryBody) {
	b, err := json.Marshal(body)
	if err != nil { // cannot happen: every field is a string, number or bool
		http.Error(w, `{"error":"encoding failed"}`, http.StatusInternalServerError)
		return
	}
	b = append(b, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	status := http.StatusOK
	if body.Leader == nil {
		status = http.StatusServiceUnavailable
	}
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		w.Write(b)
	}
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
