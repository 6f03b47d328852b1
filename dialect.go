package cluster

import (
	"context"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"time"

	"github.com/sqlfence/cluster/provider"
)

// A dialect is everything the SQL provider does differently on one
// database: its queries, how it binds and runs the lease statements, its
// schema lock, the bounds it gives statements on the server, and how it
// reads driver errors. There is one type per dialect (dialect_*.go). Three
// places outside them ask the name, each for one line: SchemaSQL (the mysql
// client's statement delimiter), the prepared fence (not on PostgreSQL,
// whose pgx caches statements itself) and InTx (SQLite's BEGIN IMMEDIATE).
type dialect interface {
	// name is the Dialect this type speaks.
	name() Dialect
	// queries are the statements every dialect defines.
	queries() *queries
	// prepare runs once per Init on conn: it reads what the dialect needs
	// to know of the server, and warns of what is amiss.
	prepare(ctx context.Context, conn provider.Querier, p *DBProvider) error
	// lockSchema serializes schema changes across nodes on conn; unlock
	// ends the lock, committing when ok.
	lockSchema(ctx context.Context, conn provider.Querier, prefix string) (unlock func(ok bool) error, err error)
	// ddlErrorOK reports a DDL error that means "already there".
	ddlErrorOK(err error) bool
	// acquire runs the acquisition on conn: whether it was granted, and
	// the lease row after it.
	acquire(ctx context.Context, conn provider.Querier, req provider.LeaseRequest) (granted bool, r row, err error)
	// renew extends term l by ttl and returns the new expiry, unix ms, or
	// an error matching sql.ErrNoRows when l no longer holds the lease.
	renew(ctx context.Context, conn provider.Querier, l provider.Lease, ttl time.Duration) (expires int64, err error)
	// bound returns statement q with a server-side time limit, where the
	// dialect needs one so that no statement outlives its caller.
	bound(q string, limit time.Duration) string
	// fence runs the fence query in tx and returns the lease row.
	fence(ctx context.Context, tx provider.Querier, name string, ttl time.Duration, limit time.Duration) (row, error)
	// classify names the sentinel and the hint for a driver error, and
	// the guard code (SFnnn) a trigger raised, if any.
	classify(err error) (kind error, hint, guard string)
	// transient reports an error worth retrying at once (SQLite's busy
	// file while another node opens it).
	transient(err error) bool
	// seenByLease reports whether acquire and renew also refresh the
	// node's membership row, in the same statement.
	seenByLease() bool
	// notifies reports whether a release NOTIFYs listeners (with the lease
	// name, on channel <prefix>lease).
	notifies() bool
}

// queries are the statements of the default provider that every dialect
// defines, loaded from schema/<dialect>_queries.sql. A field's tag names
// its section; every query takes its arguments in the same order on every
// dialect, the order its comment gives.
type queries struct {
	Acquire         string `sql:"acquire"`          // holder, instance, ttl ms, endpoint, name
	Renew           string `sql:"renew"`            // ttl ms, name, holder, instance, token
	Release         string `sql:"release"`          // name, holder, instance, token
	ReleaseInstance string `sql:"release_instance"` // name, holder, instance
	Leader          string `sql:"leader"`           // name
	LeaseToken      string `sql:"lease_token"`      // name
	Fence           string `sql:"fence"`            // name, timeout ms
	TipRead         string `sql:"tip_read"`         // scope
	TipWrite        string `sql:"tip_write"`        // scope, lease name, counter, hash, token
	MarkRead        string `sql:"mark_read"`        // scope
	ChainTop        string `sql:"chain_top"`        // (none; {{table}}, {{counter}})
	ChainHashAt     string `sql:"chain_hash_at"`    // counter ({{table}}, {{counter}}, {{hash}})
	VersionRead     string `sql:"version_read"`     // (none)
	VersionWrite    string `sql:"version_write"`    // version
	StateInsert     string `sql:"state_insert"`     // scope, fingerprint, node
	StateRead       string `sql:"state_read"`       // scope
	StateRotate     string `sql:"state_rotate"`     // new fingerprint, node, scope, old fingerprint
	NodeRecycle     string `sql:"node_recycle"`     // instance, node id, host, pid, endpoint, timeout ms, scope, retention ms, crashed retention ms
	NodeJoin        string `sql:"node_join"`        // scope, instance, node id, host, pid, endpoint, timeout ms
	NodeSeen        string `sql:"node_seen"`        // scope, instance
	NodeRow         string `sql:"node_row"`         // scope, instance
	NodeLeave       string `sql:"node_leave"`       // scope, instance
	NodeLive        string `sql:"node_live"`        // scope, node id, timeout ms
	NodeForget      string `sql:"node_forget"`      // scope, node id, timeout ms
	Members         string `sql:"members"`          // scope
	TipsList        string `sql:"tips_list"`        // (none)
	LeaseExpire     string `sql:"lease_expire"`     // name, token
	LeaseRetire     string `sql:"lease_retire"`     // name
	NodesRetire     string `sql:"nodes_retire"`     // scope
	// Lanes (lanes.go, provider_lanes.go) and the config version.
	LanePeek       string `sql:"lane_peek"`        // scope, window ms, scope, instance, scope, instance, window ms, instance, scope, node id, window ms, instance, scope, instance, window ms, scope, lane
	LaneClaim      string `sql:"lane_claim"`       // holder, instance, ttl ms, scope, lane, instance, timeout ms
	LaneRead       string `sql:"lane_read"`        // scope, lane
	LaneCreate     string `sql:"lane_create"`      // scope, lane
	LaneList       string `sql:"lane_list"`        // scope
	LaneExpire     string `sql:"lane_expire"`      // scope, lane, token
	LaneRelease    string `sql:"lane_release"`     // scope, lane, holder, instance
	LaneReleaseAll string `sql:"lane_release_all"` // scope, holder, instance
	LaneJoin       string `sql:"lane_join"`        // scope, instance
	ConfigRead     string `sql:"config_read"`      // scope
	ConfigCreate   string `sql:"config_create"`    // scope
	ConfigBump     string `sql:"config_bump"`      // scope
}

// loadQueries fills the string fields of the struct dst points to, and
// of the structs it embeds, from the sections of src named by their sql
// tags. A section missing from src, or one that no field takes, is a
// defect of this build and panics at load, never later.
func loadQueries(file, src string, dst any) {
	sections := parseQueries(src)
	used := map[string]bool{}
	var fill func(v reflect.Value)
	fill = func(v reflect.Value) {
		for i := range v.NumField() {
			f, sf := v.Field(i), v.Type().Field(i)
			if sf.Anonymous && f.Kind() == reflect.Struct {
				fill(f)
				continue
			}
			name, ok := sf.Tag.Lookup("sql")
			if !ok {
				continue
			}
			q, ok := sections[name]
			if !ok || q == "" {
				panic(fmt.Sprintf("cluster: schema/%s has no query %q", file, name))
			}
			f.SetString(q)
			used[name] = true
		}
	}
	fill(reflect.ValueOf(dst).Elem())
	for name := range sections {
		if !used[name] {
			panic(fmt.Sprintf("cluster: schema/%s defines query %q, which nothing uses", file, name))
		}
	}
}

// parseQueries reads the "-- name: x" sections of a queries file.
func parseQueries(src string) map[string]string {
	q := map[string]string{}
	name := ""
	var cur strings.Builder
	flush := func() {
		if name != "" {
			q[name] = strings.TrimSuffix(strings.TrimSpace(cur.String()), ";")
		}
		cur.Reset()
	}
	for line := range strings.Lines(src) {
		trimmed := strings.TrimSpace(line)
		if n, ok := strings.CutPrefix(trimmed, "-- name:"); ok {
			flush()
			name = strings.TrimSpace(n)
			continue
		}
		if strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
	}
	flush()
	return q
}

// splitStatements splits a schema file into statements: each ends at a line
// that starts in column 0 and ends with ";", or at the end of the file.
// Comment lines are dropped.
func splitStatements(src string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.Lines(src) {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "--") || (trimmed == "" && cur.Len() == 0) {
			continue
		}
		cur.WriteString(line)
		if !strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "\t") && strings.HasSuffix(trimmed, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if last := strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"); last != "" {
		out = append(out, last) // a last statement whose final line is indented
	}
	return out
}

// queryFile reads an embedded queries file with every table and function
// it names qualified by schema (a quoted schema name and a dot, "main.",
// or "" for none), so that a temporary table of the same name, which
// PostgreSQL and SQLite look up first, cannot stand in for the package's
// own. {{prefix}} inside a string literal (a NOTIFY channel, a setting's
// name) or after a dot is a name, not a table, and is left unqualified.
func queryFile(name, prefix, schema string) string {
	b, err := schemaFS.ReadFile("schema/" + name)
	if err != nil {
		panic("cluster: missing embedded schema/" + name) // a build defect, not input
	}
	src := tableRef.ReplaceAllString(string(b), "${1}"+strings.ReplaceAll(schema+prefix, "$", "$$"))
	return strings.ReplaceAll(src, "{{prefix}}", prefix)
}

// tableRef matches {{prefix}} where it starts an identifier: not inside a
// quoted name or after a dot.
var tableRef = regexp.MustCompile(`(^|[^'.\w])\{\{prefix\}\}`)

// dialects makes the dialect types, by name.
var dialects = map[Dialect]func(prefix string) dialect{
	Postgres: newPostgres,
	MySQL:    newMySQL,
	SQLite:   newSQLite,
}

// newDialect returns the dialect d for tables prefixed with prefix.
func newDialect(d Dialect, prefix string) (dialect, error) {
	mk, ok := dialects[Dialect(strings.ToLower(string(d)))]
	if !ok {
		return nil, configErrorf("Dialect (%q) must be %q, %q or %q", d, Postgres, SQLite, MySQL)
	}
	return mk(prefix), nil
}

// chainQuery fills a chain query's identifiers; they were validated by
// resolveChains.
func chainQuery(q string, ch Chain) string {
	return strings.NewReplacer("{{table}}", ch.Table, "{{counter}}", ch.CounterColumn, "{{hash}}", ch.HashColumn).Replace(q)
}

// row is the lease row as the queries return it.
type row struct {
	holder, instance, endpoint string
	token, expiresAt, now      int64
	// cold is set by a dialect that warms sessions (warmer) when the
	// acquisition ran on a session that has not been warmed.
	cold bool
}

// poller is a dialect with a statement cheaper than its acquisition for a
// follower that expects the lease held (LeaseRequest.Poll): it never
// grants, and reads the lease row as the dialect's leader query does.
type poller interface {
	poll(ctx context.Context, conn provider.Querier, req provider.LeaseRequest) (row, error)
}

// warmer is a dialect whose database sessions grant the lease faster once
// warmed: after a refused acquisition on a cold session, the provider warms
// it, so that the session's first grant, a handoff, is not also its slowest.
type warmer interface {
	warm(ctx context.Context, conn provider.Querier) error
}

func (r *row) scan(s provider.Row) error {
	return s.Scan(&r.holder, &r.instance, &r.token, &r.expiresAt, &r.endpoint, &r.now)
}

func (r row) lease(name string) provider.Lease {
	return provider.Lease{Name: name, Holder: r.holder, Instance: r.instance, Endpoint: r.endpoint,
		FencingToken: uint64(r.token), ExpiresAt: time.UnixMilli(r.expiresAt)}
}

func (r row) held() *LeaseHeldError {
	return &LeaseHeldError{Holder: r.holder, Instance: r.instance, Endpoint: r.endpoint, FencingToken: uint64(r.token),
		ExpiresAt: time.UnixMilli(r.expiresAt), Remaining: time.Duration(r.expiresAt-r.now) * time.Millisecond}
}
