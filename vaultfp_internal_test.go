package cluster

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"
)

// decodeVaultKeyEncoding inverts appendVaultKeyEncoding. It fails unless b
// is exactly one encoding, with no bytes left over.
func decodeVaultKeyEncoding(b []byte) (domain string, keys []namedKey, err error) {
	next := func() ([]byte, error) {
		if len(b) < 4 {
			return nil, errors.New("short length prefix")
		}
		n := binary.BigEndian.Uint32(b)
		b = b[4:]
		if uint64(len(b)) < uint64(n) {
			return nil, fmt.Errorf("length %d, only %d bytes left", n, len(b))
		}
		v := b[:n:n]
		b = b[n:]
		return v, nil
	}
	d, err := next()
	if err != nil {
		return "", nil, fmt.Errorf("domain: %w", err)
	}
	if len(b) < 4 {
		return "", nil, errors.New("short key count")
	}
	count := binary.BigEndian.Uint32(b)
	b = b[4:]
	for i := range count {
		name, err := next()
		if err != nil {
			return "", nil, fmt.Errorf("key %d scheme: %w", i, err)
		}
		pub, err := next()
		if err != nil {
			return "", nil, fmt.Errorf("key %d bytes: %w", i, err)
		}
		keys = append(keys, namedKey{scheme: string(name), pub: pub})
	}
	if len(b) != 0 {
		return "", nil, fmt.Errorf("%d trailing bytes", len(b))
	}
	return string(d), keys, nil
}

// splitNamedKeys turns arbitrary fuzz bytes into a list of keys: each key
// is a length byte and that many name bytes, then a length byte and that
// many key bytes, cut short where the input ends.
func splitNamedKeys(data []byte) []namedKey {
	take := func() []byte {
		if len(data) == 0 {
			return nil
		}
		n := min(int(data[0]), len(data)-1)
		v := data[1 : 1+n]
		data = data[1+n:]
		return v
	}
	var keys []namedKey
	for len(data) > 0 {
		name := take()
		keys = append(keys, namedKey{scheme: string(name), pub: take()})
	}
	return keys
}

func equalNamedKeys(a, b []namedKey) bool {
	return slices.EqualFunc(a, b, func(x, y namedKey) bool {
		return x.scheme == y.scheme && bytes.Equal(x.pub, y.pub)
	})
}

// FuzzVaultKeyEncoding checks that the encoding VaultKeyFingerprint hashes
// is injective: it decodes back to exactly its input, and two different
// inputs never encode the same.
func FuzzVaultKeyEncoding(f *testing.F) {
	f.Add(vaultKeyDomain, []byte{}, vaultKeyDomain, []byte{0, 0})
	f.Add(vaultKeyDomain, []byte("\x01a\x02bc"), vaultKeyDomain, []byte("\x02ab\x01c"))
	f.Add(vaultKeyDomain, []byte("\x03abc\x00\x01x\x01y"), vaultKeyDomain, []byte("\x03abc\x00"))
	f.Add("", []byte("\x00\x00"), "\x00\x00\x00\x00", []byte{})
	f.Fuzz(func(t *testing.T, domainA string, a []byte, domainB string, b []byte) {
		ka, kb := splitNamedKeys(a), splitNamedKeys(b)
		encA := appendVaultKeyEncoding(nil, domainA, ka)
		encB := appendVaultKeyEncoding(nil, domainB, kb)

		for _, c := range []struct {
			domain string
			keys   []namedKey
			enc    []byte
		}{{domainA, ka, encA}, {domainB, kb, encB}} {
			d, keys, err := decodeVaultKeyEncoding(c.enc)
			if err != nil {
				t.Fatalf("decode(encode(%q, %q)): %v", c.domain, c.keys, err)
			}
			if d != c.domain || !equalNamedKeys(keys, c.keys) {
				t.Fatalf("decode(encode(%q, %q)) = %q, %q", c.domain, c.keys, d, keys)
			}
		}

		same := domainA == domainB && equalNamedKeys(ka, kb)
		if got := bytes.Equal(encA, encB); got != same {
			t.Fatalf("inputs equal = %v, encodings equal = %v:\n  %q %q\n  %q %q", same, got, domainA, ka, domainB, kb)
		}

		// Appending keeps what dst held.
		prefix := []byte("prefix")
		if got := appendVaultKeyEncoding(slices.Clone(prefix), domainA, ka); !bytes.Equal(got, append(prefix, encA...)) {
			t.Fatalf("append to %q = %q, want the prefix then %q", prefix, got, encA)
		}
	})
}

// TestVaultKeyEncodingSeparates pins cases a naive concatenation would
// confuse.
func TestVaultKeyEncodingSeparates(t *testing.T) {
	pub := []byte{1, 2, 3, 4}
	tests := []struct {
		name string
		a, b []namedKey
	}{
		{"same bytes, different scheme",
			[]namedKey{{"ML-KEM-768", pub}}, []namedKey{{"Kyber768", pub}}},
		{"boundary between scheme and key",
			[]namedKey{{"ab", []byte("c")}}, []namedKey{{"a", []byte("bc")}}},
		{"boundary between keys",
			[]namedKey{{"x", []byte("ab")}, {"y", []byte("c")}}, []namedKey{{"x", []byte("a")}, {"y", []byte("bc")}}},
		{"order",
			[]namedKey{{"x", pub}, {"y", pub}}, []namedKey{{"y", pub}, {"x", pub}}},
		{"empty key versus no key",
			[]namedKey{{"x", nil}}, nil},
		{"duplicate",
			[]namedKey{{"x", pub}}, []namedKey{{"x", pub}, {"x", pub}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ea := appendVaultKeyEncoding(nil, vaultKeyDomain, tt.a)
			eb := appendVaultKeyEncoding(nil, vaultKeyDomain, tt.b)
			if bytes.Equal(ea, eb) {
				t.Fatalf("%q and %q both encode as %x", tt.a, tt.b, ea)
			}
		})
	}
}
