package cluster_test

import (
	"context"
	"crypto/sha3"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudflare/circl/kem"
	"github.com/cloudflare/circl/kem/schemes"
	"github.com/sqlfence/cluster"
	"github.com/sqlfence/cluster/internal/testdb"
)

// Schemes the fingerprint vectors use, by their circl names.
const (
	mlkem768   = "ML-KEM-768"
	mlkem1024  = "ML-KEM-1024"
	x25519     = "HPKE_KEM_X25519_HKDF_SHA256"
	xmlkem768  = "X25519MLKEM768"
	kyber768   = "Kyber768"
	pinnedRing = "X25519MLKEM768,ML-KEM-1024,HPKE_KEM_X25519_HKDF_SHA256"
)

// Pinned fingerprints of keys derived by vaultKey(t, name, 0), also checked
// once against Python's hashlib.sha3_512. They change only if the encoding,
// the domain string or circl's key derivation does.
var pinned = map[string]string{
	mlkem768:   "adcd5b3aea542ae38822eb03ff87248345bfc8a555efc90597ba8c6039d0811a88d4bc10e103a6d078859dea647eaa309f541a9f580cecae8ba5abb976e7a517",
	x25519:     "3a89a076169d7d03a1823ff68ea5bc8a6c414a4008300ae1c9773118ce2e3d97fb34540a87721c959a72b8b203646eade47508612691f70e416d319a73fac743",
	pinnedRing: "49f72b71d07fac81868092cd34a0bd7e0a3711652b26f4fb1b5c0a7db56f70c75911575822876506cec5851d3e4b775ab4ec41221ea056f445679f5d078502f8",
}

// refFingerprint is an independent implementation of the documented
// encoding, so that a change to the package's encoder fails the tests.
func refFingerprint(t *testing.T, keys ...kem.PublicKey) string {
	t.Helper()
	h := sha3.New512()
	put := func(b []byte) {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	put([]byte("sqlfence/cluster vault-key fingerprint v1"))
	var count [4]byte
	binary.BigEndian.PutUint32(count[:], uint32(len(keys)))
	h.Write(count[:])
	for _, k := range keys {
		pub, err := k.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		put([]byte(k.Scheme().Name()))
		put(pub)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func fingerprint(t *testing.T, keys ...kem.PublicKey) string {
	t.Helper()
	fp, err := cluster.VaultKeyFingerprint(keys...)
	if err != nil {
		t.Fatalf("VaultKeyFingerprint: %v", err)
	}
	if !cluster.ValidVaultKeyFingerprint(fp) {
		t.Fatalf("VaultKeyFingerprint = %q, not a valid fingerprint", fp)
	}
	return fp
}

func TestVaultKeyFingerprintVectors(t *testing.T) {
	tests := []struct {
		name    string
		schemes []string
	}{
		{mlkem768, []string{mlkem768}},
		{mlkem1024, []string{mlkem1024}},
		{x25519, []string{x25519}},
		{xmlkem768, []string{xmlkem768}},
		{pinnedRing, strings.Split(pinnedRing, ",")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var keys []kem.PublicKey
			for _, name := range tt.schemes {
				k := vaultKey(t, name, 0)
				if got := k.Scheme().Name(); got != name {
					t.Fatalf("scheme %q names itself %q", name, got)
				}
				keys = append(keys, k)
			}
			got := fingerprint(t, keys...)
			if want := refFingerprint(t, keys...); got != want {
				t.Errorf("VaultKeyFingerprint = %s\nreference encoding  = %s", got, want)
			}
			if want, ok := pinned[tt.name]; ok && got != want {
				t.Errorf("VaultKeyFingerprint = %s\npinned vector       = %s", got, want)
			}
			if again := fingerprint(t, keys...); again != got {
				t.Errorf("second call = %s, first = %s", again, got)
			}
		})
	}
}

func TestVaultKeyFingerprintOrder(t *testing.T) {
	a, b := vaultKey(t, mlkem768, 0), vaultKey(t, x25519, 0)
	ab, ba := fingerprint(t, a, b), fingerprint(t, b, a)
	if ab == ba {
		t.Errorf("FP(a, b) = FP(b, a) = %s", ab)
	}

	// Two keys of one scheme, from different seeds.
	c, d := vaultKey(t, mlkem768, 0), vaultKey(t, mlkem768, 1)
	if cd, dc := fingerprint(t, c, d), fingerprint(t, d, c); cd == dc {
		t.Errorf("FP(c, d) = FP(d, c) = %s", cd)
	}

	// The same keys, derived again, give the same fingerprint.
	if again := fingerprint(t, vaultKey(t, mlkem768, 0), vaultKey(t, x25519, 0)); again != ab {
		t.Errorf("FP of re-derived (a, b) = %s, want %s", again, ab)
	}

	// Duplicates count.
	if aa := fingerprint(t, a, a); aa == fingerprint(t, a) {
		t.Errorf("FP(a, a) = FP(a) = %s", aa)
	}
}

// TestVaultKeyFingerprintSchemeSeparates hashes the same key bytes under
// two schemes: ML-KEM-768 and Kyber768 public keys share their format.
func TestVaultKeyFingerprintSchemeSeparates(t *testing.T) {
	ky := vaultKey(t, kyber768, 0)
	pub, err := ky.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	ml, err := schemes.ByName(mlkem768).UnmarshalBinaryPublicKey(pub)
	if err != nil {
		t.Fatalf("Kyber768 key bytes as ML-KEM-768: %v", err)
	}
	if mlPub, _ := ml.MarshalBinary(); string(mlPub) != string(pub) {
		t.Fatal("ML-KEM-768 re-encoded the Kyber768 key bytes differently")
	}
	if a, b := fingerprint(t, ky), fingerprint(t, ml); a == b {
		t.Errorf("same bytes under %s and %s both fingerprint as %s", kyber768, mlkem768, a)
	}
}

// fakePublicKey is a kem.PublicKey whose methods the test sets.
type fakePublicKey struct {
	SchemeFunc        func() kem.Scheme
	MarshalBinaryFunc func() ([]byte, error)
}

func (k *fakePublicKey) Scheme() kem.Scheme             { return k.SchemeFunc() }
func (k *fakePublicKey) MarshalBinary() ([]byte, error) { return k.MarshalBinaryFunc() }
func (k *fakePublicKey) Equal(other kem.PublicKey) bool { return k == other }

func TestVaultKeyFingerprintErrors(t *testing.T) {
	good := vaultKey(t, mlkem768, 0)
	errMarshal := errors.New("hardware token unplugged")
	failing := &fakePublicKey{
		SchemeFunc:        func() kem.Scheme { return schemes.ByName(mlkem1024) },
		MarshalBinaryFunc: func() ([]byte, error) { return nil, errMarshal },
	}
	var typedNil *fakePublicKey

	tests := []struct {
		name     string
		keys     []kem.PublicKey
		is       error
		contains []string
	}{
		{"no keys", nil, cluster.ErrInvalidConfig, []string{"at least one"}},
		{"nil key", []kem.PublicKey{good, nil}, cluster.ErrInvalidConfig, []string{"key 1 "}},
		{"typed nil key", []kem.PublicKey{typedNil, good}, cluster.ErrInvalidConfig, []string{"key 0 "}},
		{"marshal fails", []kem.PublicKey{good, good, failing}, errMarshal, []string{"key 2 ", mlkem1024}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fp, err := cluster.VaultKeyFingerprint(tt.keys...)
			if err == nil {
				t.Fatalf("VaultKeyFingerprint = %q, want an error", fp)
			}
			if fp != "" {
				t.Errorf("VaultKeyFingerprint returned %q with error %v", fp, err)
			}
			if !errors.Is(err, tt.is) {
				t.Errorf("error %q does not wrap %q", err, tt.is)
			}
			for _, s := range tt.contains {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

func TestValidVaultKeyFingerprint(t *testing.T) {
	valid := strings.Repeat("0123456789abcdef", 8)
	tests := []struct {
		name string
		s    string
		want bool
	}{
		{"all hex digits", valid, true},
		{"zeros", strings.Repeat("0", cluster.VaultKeyFingerprintLen), true},
		{"empty", "", false},
		{"16-char log prefix", valid[:16], false},
		{"one short", valid[1:], false},
		{"one long", valid + "0", false},
		{"uppercase", strings.ToUpper(valid), false},
		{"one uppercase", "A" + valid[1:], false},
		{"non-hex letter", "g" + valid[1:], false},
		{"space", " " + valid[1:], false},
		{"0x prefix", "0x" + valid[2:], false},
		{"SHA3-256 length", valid[:64], false},
		{"multibyte", "é" + valid[2:], false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := cluster.ValidVaultKeyFingerprint(tt.s); got != tt.want {
				t.Errorf("ValidVaultKeyFingerprint(%q) = %v, want %v", tt.s, got, tt.want)
			}
		})
	}
}

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
