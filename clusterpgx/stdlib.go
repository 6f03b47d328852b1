package clusterpgx

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/sqlfence/cluster"
)

// NewStdlibProvider returns the default provider over db, a database/sql
// pool of pgx's stdlib driver, that also hears lease releases through
// LISTEN on a raw connection of db, so followers take over at once rather
// than at their next poll. [cluster.NewDBProvider] over the same db polls.
// An empty tablePrefix means "cluster_".
func NewStdlibProvider(db *sql.DB, tablePrefix string) (*cluster.DBProvider, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: clusterpgx.NewStdlibProvider needs a *sql.DB", cluster.ErrInvalidConfig)
	}
	if _, ok := db.Driver().(*stdlib.Driver); !ok {
		return nil, fmt.Errorf("%w: clusterpgx.NewStdlibProvider needs a *sql.DB of pgx's stdlib driver, not %T", cluster.ErrInvalidConfig, db.Driver())
	}
	return cluster.NewSQLProvider(stdlibPool{cluster.SQLPool(db), db}, cluster.Postgres, tablePrefix)
}

// stdlibPool is cluster's database/sql pool that can also LISTEN.
type stdlibPool struct {
	cluster.Pool
	db *sql.DB
}

var _ cluster.ListenPool = stdlibPool{}

// Listen implements [cluster.ListenPool] on a connection of db, which it
// stops listening (UNLISTEN *) before giving it back.
func (p stdlibPool) Listen(ctx context.Context, channel string, ready func(), notify func(string)) error {
	conn, err := p.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("clusterpgx: a connection of %T cannot LISTEN", dc)
		}
		pc := sc.Conn()
		err := listen(ctx, pc, channel, ready, notify)
		if !pc.IsClosed() {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			if _, uerr := pc.Exec(uctx, "UNLISTEN *"); uerr != nil {
				pc.Close(uctx) // database/sql discards a closed connection
			}
		}
		return err
	})
}
