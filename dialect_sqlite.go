package cluster

import (
	"context"
	"database/sql"
	"errors"
	"regexp"
	"strings"
	"time"

	"github.com/sqlfence/cluster/provider"
)

// sqlite is the SQLite dialect (3.42 or later, modernc.org/sqlite): nodes
// share one file on one host; lease operations are single statements with
// RETURNING; the guard triggers raise errors whose text starts with
// "sqlfence SFnnn:". busy_timeout bounds every wait for the write lock.
type sqlite struct {
	q struct {
		queries
		BusyTimeout string `sql:"busy_timeout"` // (none)
		SchemaLock  string `sql:"schema_lock"`  // (none)
		laneRenewQueries
	}
}

func newSQLite(prefix string) dialect {
	d := &sqlite{}
	// main.: a temporary table of the same name is looked up first.
	loadQueries("sqlite_queries.sql", queryFile("sqlite_queries.sql", prefix, "main."), &d.q)
	return d
}

func (d *sqlite) name() Dialect     { return SQLite }
func (d *sqlite) queries() *queries { return &d.q.queries }

// prepare warns when nodes would fail instead of waiting for each other.
func (d *sqlite) prepare(ctx context.Context, conn provider.Querier, p *DBProvider) error {
	var ms int64
	if err := conn.QueryRow(ctx, d.q.BusyTimeout).Scan(&ms); err == nil && ms == 0 {
		p.log.WarnContext(ctx, "cluster: SQLite busy_timeout is 0, so nodes sharing the file fail instead of waiting for each other; "+
			"add _pragma=busy_timeout(5000) to the DSN")
	}
	return nil
}

func (d *sqlite) lockSchema(ctx context.Context, conn provider.Querier, _ string) (func(bool) error, error) {
	if _, err := conn.Exec(ctx, d.q.SchemaLock); err != nil {
		return nil, err
	}
	background := context.WithoutCancel(ctx)
	return func(ok bool) error { return endTx(background, conn, ok) }, nil
}

// ddlErrorOK keeps a column a version added (SQLite has no ADD COLUMN IF
// NOT EXISTS): the schema file, applied to tables of an older version that
// already had it, finds it there.
func (d *sqlite) ddlErrorOK(err error) bool {
	return err != nil && strings.Contains(err.Error(), "duplicate column name")
}

func (d *sqlite) acquire(ctx context.Context, conn provider.Querier, req provider.LeaseRequest) (bool, row, error) {
	var r row
	// Read first: a read takes no write lock (in WAL mode it waits for no
	// writer either), so an attempt on an unexpired term neither waits for
	// a fenced transaction nor holds up the leader's renew or the
	// application's writes. A release that commits just after the read is
	// missed, as if the attempt had come just before it.
	err := r.scan(conn.QueryRow(ctx, d.q.Leader, req.Name))
	if err == nil && r.expiresAt > r.now {
		return false, r, nil
	}
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return false, r, err
	}
	var granted bool
	err = conn.QueryRow(ctx, d.q.Acquire, req.Holder, req.Instance, req.TTL.Milliseconds(), req.Endpoint, req.Name).
		Scan(&granted, &r.holder, &r.instance, &r.token, &r.expiresAt, &r.endpoint, &r.now)
	if errors.Is(err, sql.ErrNoRows) {
		// Not granted: read who holds it.
		return false, r, r.scan(conn.QueryRow(ctx, d.q.Leader, req.Name))
	}
	return granted, r, err
}

func (d *sqlite) renew(ctx context.Context, conn provider.Querier, l provider.Lease, ttl time.Duration) (int64, error) {
	var expires int64
	err := conn.QueryRow(ctx, d.q.Renew, ttl.Milliseconds(), l.Name, l.Holder, l.Instance, int64(l.FencingToken)).Scan(&expires)
	return expires, err
}

func (d *sqlite) bound(q string, _ time.Duration) string { return q }

func (d *sqlite) fence(ctx context.Context, tx provider.Querier, name string, ttl, limit time.Duration) (row, error) {
	var r row
	err := r.scan(tx.QueryRow(ctx, d.fenceQuery(ttl, limit), name, ttl.Milliseconds()))
	return r, err
}

func (d *sqlite) fenceQuery(time.Duration, time.Duration) string { return d.q.Fence }

var sqliteGuard = regexp.MustCompile(`sqlfence (SF\d{3}):`)

func (d *sqlite) classify(err error) (kind error, hint, guard string) {
	msg := err.Error()
	if m := sqliteGuard.FindStringSubmatch(msg); m != nil {
		return nil, "", m[1]
	}
	var lite interface{ Code() int }
	if errors.As(err, &lite) {
		switch lite.Code() & 0xff {
		case 8: // SQLITE_READONLY
			return ErrReadOnly, "the database file or its directory is not writable", ""
		case 5, 6: // SQLITE_BUSY, SQLITE_LOCKED
			return nil, "another connection holds the write lock; set a busy timeout (_pragma=busy_timeout(5000) in the DSN)", ""
		}
	}
	switch {
	case strings.Contains(msg, "no such table"):
		return ErrSchema, "the cluster tables are missing; restart a node so New recreates them", ""
	case strings.Contains(msg, "syntax error"):
		return nil, "syntax error: is Dialect right for this database?", ""
	}
	return nil, "", ""
}

// transient reports SQLITE_BUSY and SQLITE_LOCKED: opening a connection
// runs the DSN's pragmas, and one that changes the journal mode fails at
// once, without waiting for the busy timeout, while another node opens the
// same file.
func (d *sqlite) transient(err error) bool {
	var lite interface{ Code() int }
	if !errors.As(err, &lite) {
		return false
	}
	code := lite.Code() & 0xff
	return code == 5 || code == 6
}

func (d *sqlite) seenByLease() bool { return false }

func (d *sqlite) notifies() bool { return false }
