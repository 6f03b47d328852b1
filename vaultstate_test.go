package cluster_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudflare/circl/kem"

	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

func readState(t *testing.T, tg testdb.Target) (fp string, epoch int64, by string) {
	t.Helper()
	q := bind(tg.Dialect, "SELECT vault_key_fp, rotation_epoch, recorded_by_node FROM "+tg.Prefix+"state WHERE scope = ?")
	if err := tg.Open(t).QueryRowContext(context.Background(), q, "leader").Scan(&fp, &epoch, &by); err != nil {
		t.Fatal(err)
	}
	return fp, epoch, by
}

func TestVaultKeysDriftAndRotation(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		oldFP, newFP, otherFP := fpOf(t, 0), fpOf(t, 1), fpOf(t, 2)

		// The first node records its fingerprint; a node with the same keys joins.
		if _, err := vaultNode(t, tg, "a", 0); err != nil {
			t.Fatal(err)
		}
		if _, err := vaultNode(t, tg, "b", 0); err != nil {
			t.Fatalf("same keys refused: %v", err)
		}
		if fp, epoch, by := readState(t, tg); fp != oldFP || epoch != 0 || by != "a" {
			t.Fatalf("state = %s… epoch %d by %q", fp[:16], epoch, by)
		}

		// Drift: other keys are refused, and the message names both nodes
		// and fingerprint prefixes, never whole fingerprints.
		_, err := vaultNode(t, tg, "c", 1)
		if !errors.Is(err, cluster.ErrVaultKeyDrift) {
			t.Fatalf("other keys = %v, want ErrVaultKeyDrift", err)
		}
		for _, want := range []string{`"c"`, `"a"`, newFP[:16], oldFP[:16], "AcceptVaultKeyRotation"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("drift message %q lacks %q", err, want)
			}
		}
		if strings.Contains(err.Error(), newFP[:17]) || strings.Contains(err.Error(), oldFP[:17]) {
			t.Errorf("drift message shows more than 16 hex characters: %v", err)
		}

		// A wrong blessed fingerprint is still refused.
		_, err = vaultNode(t, tg, "c", 1, func(c *cluster.Config) {
			c.AcceptVaultKeyRotation = true
			c.ExpectedVaultKeyFingerprint = otherFP
		})
		if !errors.Is(err, cluster.ErrVaultKeyDrift) || !strings.Contains(err.Error(), "blessed") {
			t.Fatalf("rotation to keys that are not the blessed ones = %v", err)
		}
		if fp, epoch, _ := readState(t, tg); fp != oldFP || epoch != 0 {
			t.Fatal("a refused rotation changed the state row")
		}

		// Blessed rotation advances the fingerprint and the epoch once.
		c, err := vaultNode(t, tg, "c", 1, func(c *cluster.Config) {
			c.AcceptVaultKeyRotation = true
			c.ExpectedVaultKeyFingerprint = newFP
		})
		if err != nil {
			t.Fatalf("blessed rotation: %v", err)
		}
		if fp, epoch, by := readState(t, tg); fp != newFP || epoch != 1 || by != "c" {
			t.Fatalf("after rotation: %s… epoch %d by %q", fp[:16], epoch, by)
		}
		e := c.events.wait(t, cluster.EventVaultKeyRotated, 2*time.Second)
		if !strings.Contains(e.Detail, newFP[:16]) || !strings.Contains(e.Detail, "epoch 1") {
			t.Fatalf("rotated event = %+v", e)
		}

		// Now the old keys are the drift, and a rotation without a blessed
		// fingerprint accepts whatever the node holds.
		if _, err := vaultNode(t, tg, "a2", 0); !errors.Is(err, cluster.ErrVaultKeyDrift) {
			t.Fatalf("old keys after rotation = %v", err)
		}
		if _, err := vaultNode(t, tg, "d", 2, func(c *cluster.Config) { c.AcceptVaultKeyRotation = true }); err != nil {
			t.Fatalf("unblessed rotation: %v", err)
		}
		if fp, epoch, _ := readState(t, tg); fp != otherFP || epoch != 2 {
			t.Fatalf("after the second rotation: %s… epoch %d", fp[:16], epoch)
		}
	})
}

// Nodes rotating to the same keys at once bump the epoch once.
func TestVaultKeysConcurrentRotation(t *testing.T) {
	t.Parallel()
	testdb.ForEach(t, func(t *testing.T, tg testdb.Target) {
		if _, err := vaultNode(t, tg, "a", 0); err != nil {
			t.Fatal(err)
		}
		newFP := fpOf(t, 1)
		var wg sync.WaitGroup
		errs := make([]error, 5)
		for i := range errs {
			wg.Go(func() {
				_, errs[i] = vaultNode(t, tg, "n"+string(rune('0'+i)), 1, func(c *cluster.Config) {
					c.Role = cluster.RoleFollower
					c.AcceptVaultKeyRotation = true
					c.ExpectedVaultKeyFingerprint = newFP
				})
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("node %d: %v", i, err)
			}
		}
		if fp, epoch, _ := readState(t, tg); fp != newFP || epoch != 1 {
			t.Fatalf("after 5 concurrent rotations: %s… epoch %d, want epoch 1", fp[:16], epoch)
		}
	})
}

func TestVaultKeyFingerprintConfig(t *testing.T) {
	t.Parallel()
	tg := testdb.New(t, cluster.SQLite)
	db := tg.Open(t)
	fp := fpOf(t, 0)
	key := vaultKey(t, mlkem768, 0)
	for name, tt := range map[string]struct {
		cfg  cluster.Config
		want string
	}{
		"both":              {cluster.Config{VaultKeys: []kem.PublicKey{key}, VaultKeyFingerprint: fp}, "both set"},
		"short fingerprint": {cluster.Config{VaultKeyFingerprint: "abc"}, "VaultKeyFingerprint"},
		"upper case":        {cluster.Config{VaultKeyFingerprint: strings.ToUpper(fp)}, "lowercase hex"},
		"nil key":           {cluster.Config{VaultKeys: []kem.PublicKey{nil}}, "VaultKeys"},
		"bad expected":      {cluster.Config{VaultKeyFingerprint: fp, AcceptVaultKeyRotation: true, ExpectedVaultKeyFingerprint: "x"}, "ExpectedVaultKeyFingerprint"},
		"expected alone":    {cluster.Config{VaultKeyFingerprint: fp, ExpectedVaultKeyFingerprint: fp}, "AcceptVaultKeyRotation is false"},
		"accept no keys":    {cluster.Config{AcceptVaultKeyRotation: true}, "no VaultKeys"},
	} {
		cfg := tt.cfg
		cfg.NodeID = "n"
		if cfg.Provider == nil {
			cfg.DB = db
		}
		err := cfg.Validate()
		if !errors.Is(err, cluster.ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", name, err, tt.want)
		}
	}
	// A provider without a StateStore cannot serve vault keys: New says so.
	_, err := cluster.New(context.Background(), cluster.Config{NodeID: "n", VaultKeyFingerprint: fp, Provider: &fakeProvider{}})
	if !errors.Is(err, cluster.ErrInvalidConfig) || !strings.Contains(err.Error(), "StateStore") {
		t.Errorf("vault keys with a provider that has no StateStore: %v", err)
	}
	// A fingerprint of keys of another kind works like VaultKeys.
	if err := (cluster.Config{NodeID: "n", DB: db, VaultKeyFingerprint: fp}).Validate(); err != nil {
		t.Fatal(err)
	}
}
