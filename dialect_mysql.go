package cluster

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sqlfence/cluster/provider"
)

// mySQL is the MySQL 8.0 and MariaDB 10.5+ dialect (go-sql-driver/mysql).
// MySQL has no UPDATE ... RETURNING, so acquire and renew are an UPDATE
// that leaves the token or expiry in LAST_INSERT_ID, read back on the same
// connection. The driver abandons a cancelled statement by closing its
// connection while the server keeps it waiting for the lease row's lock,
// so every lease statement carries a server-side time limit (bound).
type mySQL struct {
	q struct {
		queries
		InsertRow       string `sql:"insert_row"`        // name
		LastInsertID    string `sql:"last_insert_id"`    // (none)
		ServerVersion   string `sql:"server_version"`    // (none)
		TempProbe       string `sql:"temp_probe"`        // (none)
		TempDrop        string `sql:"temp_drop"`         // (none)
		SchemaLock      string `sql:"schema_lock"`       // lock name
		SchemaUnlock    string `sql:"schema_unlock"`     // lock name
		LockWaitSave    string `sql:"lock_wait_save"`    // seconds
		LockWaitRestore string `sql:"lock_wait_restore"` // (none)
		IdleTimeout     string `sql:"idle_timeout"`      // (none; see idleTimeout)
		FenceMariaDB    string `sql:"fence_mariadb"`     // name
		AcquireRead     string `sql:"acquire_read"`      // name
		BoundMariaDB    string `sql:"bound_mariadb"`     // template
		BoundMySQL      string `sql:"bound_mysql"`       // template
		laneRenewQueries
	}
	// mariadb is learnt by prepare: MariaDB bounds a whole statement and
	// can end an idle transaction; MySQL 8 takes hints and cannot.
	mariadb bool
}

func newMySQL(prefix string) dialect {
	d := &mySQL{}
	// Unqualified: MySQL looks a temporary table up first even in a
	// qualified name (see prepare's warning).
	loadQueries("mysql_queries.sql", queryFile("mysql_queries.sql", prefix, ""), &d.q)
	return d
}

func (d *mySQL) name() Dialect     { return MySQL }
func (d *mySQL) queries() *queries { return &d.q.queries }

// prepare tells MariaDB from MySQL, and warns when this role may create
// temporary tables, which lets a session of it hide the lease table from
// the chain-tip guard (see schema/mysql.sql).
func (d *mySQL) prepare(ctx context.Context, conn provider.Querier, p *DBProvider) error {
	var version string
	if err := conn.QueryRow(ctx, d.q.ServerVersion).Scan(&version); err != nil {
		return p.wrap("read server version", err)
	}
	d.mariadb = strings.Contains(strings.ToLower(version), "mariadb")
	if _, err := conn.Exec(ctx, d.q.TempProbe); err == nil {
		conn.Exec(context.WithoutCancel(ctx), d.q.TempDrop)
		p.log.WarnContext(ctx, "cluster: this MySQL role holds CREATE TEMPORARY TABLES: a session of it can hide the lease table behind a temporary one "+
			"and write chain tips under a made-up fencing token; revoke the privilege from the application's role (see docs/guarantees.md, What holds on each dialect)",
			"server_version", version)
	}
	return nil
}

func (d *mySQL) lockSchema(ctx context.Context, conn provider.Querier, prefix string) (func(bool) error, error) {
	background := context.WithoutCancel(ctx)
	name := "sqlfence_cluster_schema:" + prefix
	var got sql.NullInt64
	if err := conn.QueryRow(ctx, d.q.SchemaLock, name).Scan(&got); err != nil {
		return nil, err
	}
	if got.Int64 != 1 {
		return nil, fmt.Errorf("GET_LOCK(%q) timed out after 60s: another node holds it while creating the schema", name)
	}
	// Each DDL statement waits at most schemaLockTimeout for the tables'
	// metadata lock; the connection's own value is put back after.
	if _, err := conn.Exec(ctx, d.q.LockWaitSave, int64(schemaLockTimeout/time.Second)); err != nil {
		conn.Exec(background, d.q.SchemaUnlock, name)
		return nil, err
	}
	return func(bool) error {
		_, err := conn.Exec(background, d.q.LockWaitRestore)
		_, uerr := conn.Exec(background, d.q.SchemaUnlock, name)
		return errors.Join(err, uerr)
	}, nil
}

// ddlErrorOK keeps an existing trigger (error 1359) or column (1060):
// MySQL DDL is not transactional, so triggers carry their version in
// their names, and a schema applied again finds them, and the columns a
// version added, there.
func (d *mySQL) ddlErrorOK(err error) bool {
	var my *mysql.MySQLError
	return errors.As(err, &my) && (my.Number == 1359 || my.Number == 1060)
}

// acquire reads the lease row first, without locking it, and stops there
// when the term it shows is unexpired: InnoDB's UPDATE locks the row it
// finds by the key even when the rest of its WHERE refuses it, so every
// follower's attempt would wait for the leader's fenced transactions
// (which hold the row in share mode) and queue its renews. Otherwise it
// grants a term with one UPDATE, then reads the row again: for the expiry
// of the term granted, or for who took it first. A release that commits
// just after the read is missed, as if the attempt had come just before
// it.
func (d *mySQL) acquire(ctx context.Context, conn provider.Querier, req provider.LeaseRequest) (bool, row, error) {
	var r row
	limit := statementLimit(ctx)
	for attempt := 0; ; attempt++ {
		err := r.scan(conn.QueryRow(ctx, d.q.AcquireRead, req.Name))
		if errors.Is(err, sql.ErrNoRows) && attempt == 0 {
			// No row yet: create a free one and try again.
			if _, err := conn.Exec(ctx, d.bound(d.q.InsertRow, limit), req.Name); err != nil {
				return false, r, err
			}
			continue
		}
		if err != nil || r.expiresAt > r.now {
			return false, r, err
		}
		n, err := conn.Exec(ctx, d.bound(d.q.Acquire, limit), req.Holder, req.Instance, req.TTL.Milliseconds(), req.Endpoint, req.Name)
		if err != nil {
			return false, r, err
		}
		var token int64
		if n == 1 {
			if err := conn.QueryRow(ctx, d.q.LastInsertID).Scan(&token); err != nil {
				return false, r, err
			}
		}
		if err := r.scan(conn.QueryRow(ctx, d.q.AcquireRead, req.Name)); err != nil {
			return false, r, err
		}
		// The row still shows our term unless it already expired and was
		// taken, in which case we report who took it.
		return n == 1 && r.instance == req.Instance && r.token == token, r, nil
	}
}

// renew extends the term with one UPDATE, then reads the new expiry that
// the UPDATE left in LAST_INSERT_ID.
func (d *mySQL) renew(ctx context.Context, conn provider.Querier, l provider.Lease, ttl time.Duration) (int64, error) {
	n, err := conn.Exec(ctx, d.bound(d.q.Renew, statementLimit(ctx)), ttl.Milliseconds(), l.Name, l.Holder, l.Instance, int64(l.FencingToken))
	if err != nil {
		return 0, err
	}
	if n != 1 {
		return 0, sql.ErrNoRows
	}
	var expires int64
	err = conn.QueryRow(ctx, d.q.LastInsertID).Scan(&expires)
	return expires, err
}

// bound prefixes q with a server-side limit: MariaDB bounds the whole
// statement (SET STATEMENT max_statement_time), MySQL 8 takes the
// lock-wait bound, in whole seconds, as an optimizer hint. The numbers are
// formatted here from a duration, never taken from input.
func (d *mySQL) bound(q string, limit time.Duration) string {
	limit = max(limit.Round(time.Millisecond), time.Millisecond)
	lockWait := strconv.FormatInt(max(int64((limit+time.Second-1)/time.Second), 1), 10)
	if d.mariadb {
		return strings.NewReplacer("{{seconds}}", strconv.FormatFloat(limit.Seconds(), 'f', 3, 64),
			"{{lock_wait}}", lockWait, "{{statement}}", q).Replace(d.q.BoundMariaDB)
	}
	verb, rest, _ := strings.Cut(q, " ")
	return strings.NewReplacer("{{verb}}", verb, "{{lock_wait}}", lockWait,
		"{{ms}}", strconv.FormatInt(limit.Milliseconds(), 10), "{{rest}}", rest).Replace(d.q.BoundMySQL)
}

// idleTimeout is the statement that lets MariaDB end this session's
// transactions once they idle for ttl, rounded up to whole seconds, unless
// the session already has a shorter limit.
func (d *mySQL) idleTimeout(ttl time.Duration) string {
	return strings.ReplaceAll(d.q.IdleTimeout, "{{seconds}}", strconv.FormatInt(idleSeconds(ttl), 10))
}

// fence bounds the lock wait by limit and, on MariaDB, how long the
// transaction may then idle by ttl, in place before the row is locked:
// the server applies the idle limit each time it waits for the client's
// next statement, so a limit set after the lock would leave the wait for
// that statement unbounded. MariaDB's idle_transaction_timeout is a
// session variable and stays set on the connection after the transaction
// ends, so fence first tries the read that locks only on a session that
// has it (fence_mariadb): one statement on a connection that fenced
// before; otherwise that read locks nothing and fence sets the limit and
// reads again. MySQL 8 has no such variable.
func (d *mySQL) fence(ctx context.Context, tx provider.Querier, name string, ttl, limit time.Duration) (row, error) {
	var r row
	q := d.fenceQuery(ttl, limit)
	if !d.mariadb {
		err := r.scan(tx.QueryRow(ctx, q, name, ttl.Milliseconds()))
		return r, err
	}
	err := r.scan(tx.QueryRow(ctx, q, name))
	if !errors.Is(err, sql.ErrNoRows) {
		return r, err
	}
	// No row: the session lacks the limit (or the lease row is missing,
	// which the read after the limit reports).
	if _, err := tx.Exec(ctx, d.idleTimeout(ttl)); err != nil {
		return r, err
	}
	err = r.scan(tx.QueryRow(ctx, q, name))
	return r, err
}

// fenceQuery is the locked read fence sends, bounded by limit.
func (d *mySQL) fenceQuery(ttl, limit time.Duration) string {
	if !d.mariadb {
		return d.bound(d.q.Fence, limit)
	}
	return d.bound(strings.ReplaceAll(d.q.FenceMariaDB, "{{seconds}}", strconv.FormatInt(idleSeconds(ttl), 10)), limit)
}

// idleSeconds is ttl in whole seconds, rounded up, at least 1: MariaDB's
// idle_transaction_timeout for a lease of ttl.
func idleSeconds(ttl time.Duration) int64 {
	return max(int64((ttl+time.Second-1)/time.Second), 1)
}

func (d *mySQL) classify(err error) (kind error, hint, guard string) {
	var my *mysql.MySQLError
	if !errors.As(err, &my) {
		return nil, "", ""
	}
	if code := string(my.SQLState[:]); strings.HasPrefix(code, "SF") {
		return nil, "", code
	}
	switch my.Number {
	case 1290, 1792, 1836:
		return ErrReadOnly, "the server or session is read-only (read_only, or a READ ONLY transaction); point DB at the primary", ""
	case 1146, 1054:
		return ErrSchema, "the cluster tables are missing or altered; restart a node so New recreates them", ""
	case 1064:
		return nil, "syntax error: is Dialect right for this database?", ""
	case 1205, 1213:
		return nil, "lock wait timeout or deadlock on the lease row; it is retried", ""
	case 1969, 3024:
		return nil, "the statement reached its time limit (a transaction holds the lease row)", ""
	}
	return nil, "", ""
}

func (d *mySQL) transient(error) bool { return false }

// statementLimit is a little less than what ctx leaves of the attempt, so
// the server gives up before the caller does.
func statementLimit(ctx context.Context) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return nineTenthsLeft(dl)
	}
	return defaultStatementLimit
}

// nineTenthsLeft is nine tenths of the time until dl: the time limit of a
// statement whose caller gives up at dl.
func nineTenthsLeft(dl time.Time) time.Duration {
	d := time.Until(dl)
	return d - d/10 // not d*9/10, which overflows past 32 years
}

// defaultStatementLimit bounds a lease statement whose context has no
// deadline.
const defaultStatementLimit = 10 * time.Second

func (d *mySQL) seenByLease() bool { return false }

func (d *mySQL) notifies() bool { return false }
