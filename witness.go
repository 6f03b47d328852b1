package cluster

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/sqlfence/cluster/provider"
)

// witness is what a node records in Config.WitnessFile: the highest
// fencing token and the chain tips it has seen. A database showing less was
// restored from an older snapshot, tips and all.
type witness struct {
	Version int                   `json:"version"`
	Leases  map[string]uint64     `json:"leases"` // lease name → highest fencing token seen
	Chains  map[string]witnessTip `json:"chains"` // chain name → highest tip seen committed
	// Pending holds, per chain, the last tip this node wrote, which may not
	// have committed: a database below it is not proof of a restore.
	Pending map[string]witnessTip `json:"pending,omitempty"`
}

// witnessState is a Cluster's in-memory copy of its witness file.
type witnessState struct {
	mu        sync.Mutex
	w         *witness                    // nil until first read
	pendingTx map[string]provider.Querier // chain → the transaction that wrote w.Pending[chain]
}

type witnessTip struct {
	Counter int64  `json:"counter"`
	Hash    string `json:"hash"` // hex
}

func readWitness(path string) (*witness, error) {
	w := &witness{Version: 1, Leases: map[string]uint64{}, Chains: map[string]witnessTip{}, Pending: map[string]witnessTip{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return w, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cluster: read witness file %s: %w", path, err)
	}
	if err := json.Unmarshal(b, w); err != nil || w.Version != 1 {
		return nil, fmt.Errorf("cluster: witness file %s is corrupt or of an unknown version (%v); move it aside only if you know the database was not rolled back", path, err)
	}
	if w.Leases == nil {
		w.Leases = map[string]uint64{}
	}
	if w.Chains == nil {
		w.Chains = map[string]witnessTip{}
	}
	if w.Pending == nil {
		w.Pending = map[string]witnessTip{}
	}
	return w, nil
}

// writeWitness replaces the witness file atomically and durably: a
// temporary file in the same directory, fsync, rename, fsync of the
// directory.
func writeWitness(path string, w *witness) error {
	b, err := json.MarshalIndent(w, "", "  ")
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("cluster: write witness file: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after a successful rename there is nothing to remove
	if _, err = f.Write(append(b, '\n')); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		if d, derr := os.Open(dir); derr == nil {
			err = d.Sync()
			d.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("cluster: write witness file %s: %w", path, err)
	}
	return nil
}

// witnessTip records in the witness file what AdvanceTip just wrote in tx,
// as pending: tx may still roll back. The tip tx saw before writing is
// committed, unless it is the pending write of this same transaction, so
// it becomes the confirmed tip: a restore of the whole database to any
// point before this node's previous AdvanceTip is then caught at boot.
func (c *Cluster) witnessTip(tx provider.Querier, before provider.ChainTip, had bool, wrote provider.ChainTip) error {
	c.wit.mu.Lock()
	defer c.wit.mu.Unlock()
	w, err := c.loadWitness()
	if err != nil {
		return err
	}
	chain := wrote.Chain
	if had {
		seen := witnessTip{Counter: int64(before.Counter), Hash: hex.EncodeToString(before.Hash)}
		ownPending := w.Pending[chain] == seen && c.wit.pendingTx[chain] == tx
		if old, ok := w.Chains[chain]; !ownPending && (!ok || seen.Counter > old.Counter) {
			w.Chains[chain] = seen
		}
	}
	w.Pending[chain] = witnessTip{Counter: int64(wrote.Counter), Hash: hex.EncodeToString(wrote.Hash)}
	c.wit.pendingTx[chain] = tx
	w.Leases[c.cfg.LeaseName] = max(w.Leases[c.cfg.LeaseName], wrote.FencingToken)
	return writeWitness(c.cfg.WitnessFile, w)
}

// loadWitness returns the witness file's contents, read once and then
// kept in memory. The caller holds c.wit.mu.
func (c *Cluster) loadWitness() (*witness, error) {
	if c.wit.w == nil {
		w, err := readWitness(c.cfg.WitnessFile)
		if err != nil {
			return nil, err
		}
		c.wit.w = w
	}
	return c.wit.w, nil
}
