package cluster_test

import (
	"context"
	"testing"

	"github.com/cloudflare/circl/kem"
	"github.com/cloudflare/circl/kem/schemes"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// vaultKey derives the public key of scheme name from the seed
// off, off+1, ..., off+SeedSize-1 (mod 256).
func vaultKey(t *testing.T, name string, off byte) kem.PublicKey {
	t.Helper()
	s := schemes.ByName(name)
	if s == nil {
		t.Fatalf("circl has no KEM scheme %q", name)
	}
	seed := make([]byte, s.SeedSize())
	for i := range seed {
		seed[i] = off + byte(i)
	}
	pk, _ := s.DeriveKeyPair(seed)
	return pk
}

// fpOf returns the fingerprint of a ring of one ML-KEM-768 key derived from
// seed offset off.
func fpOf(t *testing.T, off byte) string {
	t.Helper()
	fp, err := cluster.VaultKeyFingerprint(vaultKey(t, mlkem768, off))
	if err != nil {
		t.Fatal(err)
	}
	return fp
}

// vaultNode starts a node with vault keys derived from off, or returns the
// error New returned.
func vaultNode(t *testing.T, tg testdb.Target, id string, off byte, edit ...func(*cluster.Config)) (*node, error) {
	t.Helper()
	cfg := tg.Config(t, tg.Open(t), id)
	cfg.VaultKeys = []kem.PublicKey{vaultKey(t, mlkem768, off)}
	log := &eventLog{}
	cfg.OnTransition = log.add
	for _, e := range edit {
		e(&cfg)
	}
	c, err := cluster.New(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Shutdown(context.Background()) })
	return &node{Cluster: c, events: log}, nil
}
