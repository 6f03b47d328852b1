package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/sqlfence/cluster"
)

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
