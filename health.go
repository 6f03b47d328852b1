package cluster

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// HealthHandler returns an http.Handler for liveness probes: 200 while
// this node's heartbeat runs, the database answered it within
// [Config.FenceTimeout] (for a [RoleFollower], while it can read the
// lease) and fewer than half of its last provider calls failed (see
// [Stats.RecentFailures]; calls that fail and succeed by turns, as behind
// a misconfigured pooler, keep the database "reached"), and 503
// otherwise, with a short JSON reason and never the database's own error
// text:
//
//	{"status":"ok","nodeId":"api-1","leader":true,"fencingToken":42,"lastContactMs":180}
//	{"status":"unhealthy","nodeId":"api-1","reason":"database not reached for 9.8s"}
//
// A node that is healthy but does not lead answers 200: use
// [Cluster.LeaderCheckHandler] to route writes to the leader. It answers
// GET and HEAD, with Cache-Control: no-store, and 405 to other methods.
func (c *Cluster) HealthHandler() http.Handler {
	if c.isDefault() {
		return stdHealthHandler()
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !probeMethod(w, r) {
			return
		}
		body := c.health()
		status := http.StatusOK
		if body.Status != "ok" {
			status = http.StatusServiceUnavailable
		}
		writeJSON(w, r, status, body)
	})
}

type healthBody struct {
	Status        string `json:"status"`
	NodeID        string `json:"nodeId"`
	Leader        bool   `json:"leader"`
	FencingToken  uint64 `json:"fencingToken,omitempty"`
	LastContactMs *int64 `json:"lastContactMs,omitempty"`
	Reason        string `json:"reason,omitempty"`
}

// minRecentCalls is how many provider calls the health check waits for
// before it judges their failure rate.
const minRecentCalls = 8

// health judges this node's liveness.
func (c *Cluster) health() healthBody {
	s := c.Stats()
	b := healthBody{Status: "unhealthy", NodeID: c.cfg.NodeID, Leader: s.Leader, FencingToken: s.FencingToken}
	if s.LastContact >= 0 {
		ms := s.LastContact.Milliseconds()
		b.LastContactMs = &ms
	}
	switch {
	case c.down.Load():
		b.Reason = "shut down"
	case c.haltedFlag.Load():
		b.Reason = "stopped campaigning: database rollback detected"
	case !c.heartbeating.Load():
		b.Reason = "heartbeat not running"
	case s.LastContact < 0:
		b.Reason = "database not reached yet"
	case s.LastContact > c.cfg.FenceTimeout:
		b.Reason = fmt.Sprintf("database not reached for %v", s.LastContact.Round(100*time.Millisecond))
	case s.RecentCalls >= minRecentCalls && 2*s.RecentFailures >= s.RecentCalls:
		// Calls that fail now and then succeed (a misconfigured pooler)
		// keep LastContact fresh; half of them failing is not healthy.
		b.Reason = fmt.Sprintf("database calls failing: %d of the last %d", s.RecentFailures, s.RecentCalls)
	default:
		b.Status = "ok"
	}
	return b
}

// LeaderCheckHandler returns an http.Handler for load balancers that send
// writes only to the leader: 200 on the node that leads now, 503
// elsewhere, with {"leader":true,"fencingToken":42} or {"leader":false}.
// It reads no database. It answers GET and HEAD, with Cache-Control:
// no-store, and 405 to other methods.
func (c *Cluster) LeaderCheckHandler() http.Handler {
	if c.isDefault() {
		return stdLeaderCheckHandler()
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if probeMethod(w, r) {
			token := c.FencingToken()
			serveLeaderCheck(w, r, token != 0, token)
		}
	})
}

type leaderCheckBody struct {
	Leader       bool   `json:"leader"`
	FencingToken uint64 `json:"fencingToken,omitempty"`
}

func serveLeaderCheck(w http.ResponseWriter, r *http.Request, leader bool, token uint64) {
	status := http.StatusOK
	if !leader {
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, r, status, leaderCheckBody{Leader: leader, FencingToken: token})
}

// RequireLeaderMiddleware passes requests to next only on the node that
// leads. Elsewhere it answers 503 with Retry-After (one heartbeat, in
// seconds, at least 1) and, when this node knows the leader's endpoint
// (from its leader-changed observations), an X-Cluster-Leader header
// naming it, so a client or proxy can retry there.
func (c *Cluster) RequireLeaderMiddleware(next http.Handler) http.Handler {
	if c.isDefault() {
		return stdRequireLeaderMiddleware(next)
	}
	retry := strconv.Itoa(max(int((c.cfg.HeartbeatInterval+time.Second-1)/time.Second), 1))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c.IsLeader() {
			next.ServeHTTP(w, r)
			return
		}
		h := w.Header()
		h.Set("Retry-After", retry)
		if ep := c.knownLeaderEndpoint(); ep != "" {
			h.Set("X-Cluster-Leader", ep)
		}
		http.Error(w, "this node is not the leader", http.StatusServiceUnavailable)
	})
}

// knownLeaderEndpoint is the endpoint of the last term this node observed,
// if it is another node's and still the latest.
func (c *Cluster) knownLeaderEndpoint() string {
	c.seenMu.Lock()
	defer c.seenMu.Unlock()
	if c.seen.free {
		return ""
	}
	return c.seenEndpoint
}

// MembersHandler returns an http.Handler that serves [Cluster.Members] as
// JSON, {"members":[...]}, or 503 with {"error":"membership lookup
// failed"} (never the database's words, which are logged). It answers GET
// and HEAD, with Cache-Control: no-store.
func (c *Cluster) MembersHandler() http.Handler {
	if c.isDefault() {
		return stdMembersHandler()
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !probeMethod(w, r) {
			return
		}
		ms, err := c.Members(r.Context())
		if err != nil {
			c.log.WarnContext(r.Context(), "cluster: members lookup failed", "err", err)
			writeJSON(w, r, http.StatusServiceUnavailable, map[string]string{"error": "membership lookup failed"})
			return
		}
		if ms == nil {
			ms = []Member{}
		}
		writeJSON(w, r, http.StatusOK, struct {
			Members []Member `json:"members"`
		}{ms})
	})
}

// probeMethod allows GET and HEAD, and answers 405 to the rest.
func probeMethod(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	w.Header().Set("Allow", "GET, HEAD")
	http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	return false
}

// writeJSON writes v with status, no-store, and no body for HEAD.
func writeJSON(w http.ResponseWriter, r *http.Request, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil { // cannot happen: the bodies are plain structs
		http.Error(w, `{"error":"encoding failed"}`, http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		w.Write(append(b, '\n'))
	}
}
