package cluster_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

func TestAdvanceTipRules(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		ctx := context.Background()
		db, _, a := auditLeader(t, tg, 2)
		try := func(chain string, counter uint64, hash []byte) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			return a.AdvanceTip(ctx, tx, chain, counter, hash)
		}
		if err := try("audit", 1, []byte("h")); !errors.Is(err, cluster.ErrTipBackwards) {
			t.Fatalf("backwards tip = %v, want ErrTipBackwards", err)
		}
		if err := try("ledger", 3, []byte("h")); !errors.Is(err, cluster.ErrInvalidConfig) {
			t.Fatalf("unknown chain = %v", err)
		}
		if err := try("audit", 3, nil); err == nil || !strings.Contains(err.Error(), "row hash") {
			t.Fatalf("empty hash = %v", err)
		}
		if err := try("audit", 1<<63, []byte("h")); err == nil || !strings.Contains(err.Error(), "BIGINT") {
			t.Fatalf("huge counter = %v", err)
		}
		// The same counter must mean the same row: recording it again is
		// idempotent, another hash there is a substitution.
		if err := try("audit", 2, hashOf(2, "a")); err != nil {
			t.Fatalf("re-recording the tip at the same counter with the same hash = %v", err)
		}
		if err := try("audit", 2, []byte("another row at counter 2")); !errors.Is(err, cluster.ErrTipRewritten) {
			t.Fatalf("re-recording the tip at the same counter with another hash = %v, want ErrTipRewritten", err)
		}
	})
}

func TestChainConfigErrors(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, cluster.SQLite).Open(t)
	for name, tt := range map[string]struct {
		chains []cluster.Chain
		want   string
	}{
		"no name":      {[]cluster.Chain{{Table: "audit"}}, "Chains[0].Name is required"},
		"duplicate":    {[]cluster.Chain{{Name: "a", Table: "t1"}, {Name: "a", Table: "t2"}}, `Chains[1].Name ("a") is used`},
		"bad table":    {[]cluster.Chain{{Name: "a", Table: "audit; DROP TABLE x"}}, "Chains[0].Table"},
		"quoted table": {[]cluster.Chain{{Name: "a", Table: `"Audit"`}}, "Chains[0].Table"},
		"bad counter":  {[]cluster.Chain{{Name: "a", Table: "audit", CounterColumn: "n)"}}, "Chains[0].CounterColumn"},
		"bad hash":     {[]cluster.Chain{{Name: "a", Table: "audit", HashColumn: "Hash"}}, "Chains[0].HashColumn"},
		"three part":   {[]cluster.Chain{{Name: "a", Table: "db.schema.audit"}}, "Chains[0].Table"},
	} {
		err := cluster.Config{NodeID: "n", DB: db, Chains: tt.chains}.Validate()
		if !errors.Is(err, cluster.ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", name, err, tt.want)
		}
	}
	if err := (cluster.Config{NodeID: "n", DB: db, Chains: []cluster.Chain{{Name: "a", Table: "audit.events"}}}).Validate(); err != nil {
		t.Errorf("schema-qualified table: %v", err)
	}
	for name, cfg := range map[string]cluster.Config{
		"chains":  {NodeID: "n", Provider: &fakeProvider{}, Chains: []cluster.Chain{{Name: "a", Table: "audit"}}},
		"witness": {NodeID: "n", Provider: &fakeProvider{}, WitnessFile: filepath.Join(t.TempDir(), "w.json")},
	} {
		_, err := cluster.New(context.Background(), cfg)
		if !errors.Is(err, cluster.ErrInvalidConfig) || !strings.Contains(err.Error(), "ChainStore") {
			t.Errorf("%s with a provider that has no ChainStore: %v", name, err)
		}
	}
}
