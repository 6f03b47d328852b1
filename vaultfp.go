package cluster

import (
	"context"
	"crypto/sha3"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"time"

	"github.com/cloudflare/circl/kem"
)

// VaultKeyFingerprintLen is the length, in hex characters, of a fingerprint
// returned by [VaultKeyFingerprint]: a SHA3-512 digest is 64 bytes.
const VaultKeyFingerprintLen = 128

// vaultKeyDomain separates vault-key fingerprints from every other use of
// SHA3-512 over the same bytes. Changing it changes every fingerprint.
const vaultKeyDomain = "sqlfence/cluster vault-key fingerprint v1"

// VaultKeyFingerprint returns the fingerprint of a node's vault public keys:
// [VaultKeyFingerprintLen] lowercase hex characters of the SHA3-512 digest of
//
//	len(domain) || domain || count ||
//	for each key: len(name) || name || len(pub) || pub
//
// where domain is "sqlfence/cluster vault-key fingerprint v1", count is the
// number of keys, name is key.Scheme().Name(), pub is key.MarshalBinary(),
// and every length and the count are big-endian uint32s. The prefixes make
// the encoding injective: two different lists of (scheme, key) pairs never
// hash the same bytes, and the same key bytes under two schemes differ.
//
// Order matters: the fingerprint of (a, b) differs from that of (b, a), and
// duplicates are not removed. Callers must pass the keys in a fixed,
// documented order, such as the order of their key ring, on every node.
//
// Only public keys are read; no private key ever reaches this function. A
// fingerprint of public keys is not secret, but by convention logs carry
// only its first 16 hex characters.
//
// Errors: with no keys, or with a nil key (named by its index), the error
// wraps [ErrInvalidConfig]; when a key's MarshalBinary fails, the error
// names the key's index and scheme and wraps the failure.
func VaultKeyFingerprint(keys ...kem.PublicKey) (string, error) {
	if len(keys) == 0 {
		return "", configErrorf("vault-key fingerprint: at least one public key is required")
	}
	if uint64(len(keys)) > math.MaxUint32 {
		return "", configErrorf("vault-key fingerprint: %d keys, more than the %d the encoding allows", len(keys), uint64(math.MaxUint32))
	}
	named := make([]namedKey, len(keys))
	for i, k := range keys {
		if k == nil {
			return "", configErrorf("vault-key fingerprint: key %d is nil", i)
		}
		name, pub, err := describeKey(k)
		if err != nil {
			return "", fmt.Errorf("cluster: vault-key fingerprint: key %d (%T): %w", i, k, err)
		}
		if uint64(len(name)) > math.MaxUint32 || uint64(len(pub)) > math.MaxUint32 {
			return "", fmt.Errorf("cluster: vault-key fingerprint: key %d (%s) is too long to encode", i, name)
		}
		named[i] = namedKey{scheme: name, pub: pub}
	}
	h := sha3.New512()
	h.Write(appendVaultKeyEncoding(nil, vaultKeyDomain, named))
	return hex.EncodeToString(h.Sum(nil)), nil
}

// describeKey returns k's scheme name and public key bytes. A key whose
// methods panic (a nil pointer of a key type) is reported as an error
// wrapping ErrInvalidConfig rather than crashing New.
func describeKey(k kem.PublicKey) (name string, pub []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			name, pub, err = "", nil, fmt.Errorf("%w: the key cannot describe itself (a nil key?): %v", ErrInvalidConfig, r)
		}
	}()
	s := k.Scheme()
	if s == nil {
		return "", nil, fmt.Errorf("%w: the key has no scheme", ErrInvalidConfig)
	}
	name = s.Name()
	pub, err = k.MarshalBinary()
	if err != nil {
		return "", nil, fmt.Errorf("marshal (%s): %w", name, err)
	}
	return name, pub, nil
}

// ValidVaultKeyFingerprint reports whether s has the form of a fingerprint
// returned by [VaultKeyFingerprint]: exactly [VaultKeyFingerprintLen]
// lowercase hex characters. It checks the form only, not which keys it
// belongs to.
func ValidVaultKeyFingerprint(s string) bool {
	if len(s) != VaultKeyFingerprintLen {
		return false
	}
	for i := range len(s) {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// namedKey is one public key as [VaultKeyFingerprint] hashes it.
type namedKey struct {
	scheme string // kem.Scheme.Name()
	pub    []byte // kem.PublicKey.MarshalBinary()
}

// appendVaultKeyEncoding appends to dst the encoding that
// [VaultKeyFingerprint] hashes and returns the extended slice. The caller
// ensures that len(keys) and every length fit in a uint32.
func appendVaultKeyEncoding(dst []byte, domain string, keys []namedKey) []byte {
	dst = appendLengthPrefixed(dst, domain)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(keys)))
	for _, k := range keys {
		dst = appendLengthPrefixed(dst, k.scheme)
		dst = appendLengthPrefixed(dst, k.pub)
	}
	return dst
}

// appendLengthPrefixed appends len(b) as a big-endian uint32, then b.
func appendLengthPrefixed[T string | []byte](dst []byte, b T) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(b)))
	return append(dst, b...)
}

// checkVaultKeys compares this node's vault-key fingerprint with the one
// the cluster recorded, recording it first if this node boots first. With
// AcceptVaultKeyRotation it advances the recorded fingerprint instead of
// refusing, by compare-and-set, so nodes rotating at once bump the epoch
// once.
func (c *Cluster) checkVaultKeys(ctx context.Context) error {
	fp := c.cfg.VaultKeyFingerprint
	if fp == "" {
		return nil
	}
	scope, node := c.cfg.LeaseName, c.cfg.NodeID
	inserted := false
	for attempt := 0; ; {
		st, ok, err := c.state.ReadVaultState(ctx, scope)
		if err != nil {
			return err
		}
		if !ok && !inserted {
			// The first node records its fingerprint; reading first keeps a
			// follower on a read-only replica from writing.
			inserted = true
			if err := c.state.InsertVaultState(ctx, scope, fp, node); err != nil {
				return err
			}
			continue
		}
		if !ok {
			return fmt.Errorf("cluster: the vault key fingerprint recorded for %q vanished while it was read", scope)
		}
		stored, by, epoch, at := st.Fingerprint, st.RecordedBy, st.RotationEpoch, st.RecordedAt
		if subtle.ConstantTimeCompare([]byte(fp), []byte(stored)) == 1 {
			c.log.DebugContext(ctx, "cluster: vault keys match the cluster", "vault_key_fp", prefix(fp, 16), "rotation_epoch", epoch)
			return nil
		}
		drift := func(why string) error {
			return fmt.Errorf("%w: node %q holds vault keys with fingerprint %s…, but node %q recorded %s… for the cluster at %s (rotation epoch %d); %s",
				ErrVaultKeyDrift, node, prefix(fp, 16), by, prefix(stored, 16), at.UTC().Format(time.RFC3339), epoch, why)
		}
		switch {
		case !c.cfg.AcceptVaultKeyRotation:
			return drift("this node would seal data the others cannot open. If the keys were rotated on purpose, set AcceptVaultKeyRotation and ExpectedVaultKeyFingerprint")
		case c.cfg.ExpectedVaultKeyFingerprint != "" && subtle.ConstantTimeCompare([]byte(fp), []byte(c.cfg.ExpectedVaultKeyFingerprint)) != 1:
			return drift(fmt.Sprintf("a rotation is accepted only to the blessed ExpectedVaultKeyFingerprint %s…: is this node's key file stale or mistyped?", prefix(c.cfg.ExpectedVaultKeyFingerprint, 16)))
		case attempt > 0:
			return drift("another node rotated the cluster to other keys at the same time")
		}
		rotated, err := c.state.RotateVaultState(ctx, scope, stored, fp, node)
		if err != nil {
			return err
		}
		if rotated {
			reason := fmt.Sprintf("vault key fingerprint %s… replaced %s…, rotation epoch %d", prefix(fp, 16), prefix(stored, 16), epoch+1)
			c.log.WarnContext(ctx, "cluster: vault keys rotated", "vault_key_fp", prefix(fp, 16), "previous_vault_key_fp", prefix(stored, 16), "rotation_epoch", epoch+1)
			c.events.emit(Event{Kind: EventVaultKeyRotated, NodeID: c.cfg.NodeID, At: time.Now(), Detail: reason})
			return nil
		}
		// Another node changed the row first; read what it wrote.
		attempt++
	}
}
