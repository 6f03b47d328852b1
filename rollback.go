package cluster

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"unicode"

	"github.com/sqlfence/cluster/provider"
)

// checkChains compares each chain's recorded tip with its high-water mark
// and its table, and returns the tips it found. A tip below its mark was
// truncated or restored on its own; a table whose rows end below the tip
// lost rows; a row at the tip counter with another hash was substituted.
func (c *Cluster) checkChains(ctx context.Context) (map[string]provider.ChainTip, error) {
	tips := map[string]provider.ChainTip{}
	for _, ch := range c.cfg.Chains {
		// The mark first, then the tip, then the rows: an AdvanceTip that
		// commits between two reads raises all three together, so read in
		// this order the tip is never below the mark and the rows never
		// below the tip unless something took them back.
		mark, marked, err := c.chains.HighWater(ctx, "chain/"+ch.Name)
		if err != nil {
			return nil, err
		}
		t, ok, err := c.chains.ReadTip(ctx, nil, ch.Name)
		if err != nil {
			return nil, err
		}
		switch {
		case marked && (!ok || t.Counter < mark):
			have := "no recorded tip"
			if ok {
				have = fmt.Sprintf("its tip at counter %d", t.Counter)
			}
			return nil, fmt.Errorf("%w: chain %q has %s, but the database once recorded counter %d for it: the chain tips were truncated or restored on their own",
				ErrRollbackDetected, ch.Name, have, mark)
		case !ok:
			continue // no tip yet: the chain has never advanced
		}
		tips[ch.Name] = t
		rows, err := c.chains.ChainRows(ctx, ch, t.Counter)
		if err != nil {
			return nil, err
		}
		if !rows.HasTop || rows.Top < t.Counter {
			have := "no rows"
			if rows.HasTop {
				have = fmt.Sprintf("rows up to counter %d", rows.Top)
			}
			return nil, fmt.Errorf("%w: chain %q: table %s has %s, below the recorded tip at counter %d (hash %s, fencing token %d): rows were deleted or the table was restored from an older snapshot",
				ErrRollbackDetected, ch.Name, ch.Table, have, t.Counter, shortHash(t.Hash), t.FencingToken)
		}
		if !rows.Found {
			return nil, fmt.Errorf("%w: chain %q: table %s has no row at the recorded tip counter %d (its rows run to %d): a row was removed",
				ErrRollbackDetected, ch.Name, ch.Table, t.Counter, rows.Top)
		}
		if !bytes.Equal(rows.Hash, t.Hash) {
			return nil, fmt.Errorf("%w: chain %q: the row of table %s at counter %d has hash %s, the recorded tip at counter %d has %s: the row was substituted",
				ErrRollbackDetected, ch.Name, ch.Table, t.Counter, shortHash(rows.Hash), t.Counter, shortHash(t.Hash))
		}
	}
	return tips, nil
}

// shortHash shows the start of a hash: its text when it is printable (a
// hex or base64 column), otherwise hex.
func shortHash(h []byte) string {
	printable := len(h) > 0
	for _, b := range h {
		if b >= 0x80 || !unicode.IsPrint(rune(b)) {
			printable = false
			break
		}
	}
	if printable {
		if len(h) > 16 {
			return string(h[:16]) + "…"
		}
		return string(h)
	}
	if len(h) > 8 {
		return hex.EncodeToString(h[:8]) + "…"
	}
	return hex.EncodeToString(h)
}

// checksRollback reports whether there is anything for verifyIntegrity to
// check: chains or a witness file, over a provider that keeps chain tips.
func (c *Cluster) checksRollback() bool {
	return c.chains != nil && (len(c.cfg.Chains) > 0 || c.cfg.WitnessFile != "")
}

// verifyIntegrity runs the rollback checks: each chain against its table,
// then the database against the witness file, which it then advances. token
// is the fencing token just granted to this node, or 0 at boot, when the
// token in the lease row is compared instead.
func (c *Cluster) verifyIntegrity(ctx context.Context, token uint64) error {
	if !c.checksRollback() {
		return nil
	}
	tips, err := c.checkChains(ctx)
	if err != nil {
		return err
	}
	if c.cfg.WitnessFile == "" {
		return nil
	}
	c.wit.mu.Lock()
	defer c.wit.mu.Unlock()
	w, err := readWitness(c.cfg.WitnessFile)
	if err != nil {
		return err
	}
	c.wit.w = nil // re-read below only once this check has passed
	seen := w.Leases[c.cfg.LeaseName]
	name := c.cfg.LeaseName
	if token == 0 {
		have, err := c.chains.LeaseToken(ctx, name)
		if err != nil {
			return err
		}
		if have < seen {
			return fmt.Errorf("%w: lease %q shows fencing token %d, but this node's witness file %s recorded token %d: the database was restored from an older snapshot and would issue used tokens again",
				ErrRollbackDetected, name, have, c.cfg.WitnessFile, seen)
		}
		w.Leases[name] = max(seen, have)
	} else {
		if token <= seen {
			return fmt.Errorf("%w: lease %q granted fencing token %d, but this node's witness file %s recorded token %d: the database was restored from an older snapshot and issued a used token again",
				ErrRollbackDetected, name, token, c.cfg.WitnessFile, seen)
		}
		w.Leases[name] = token
	}
	for _, ch := range c.cfg.Chains {
		old, had := w.Chains[ch.Name]
		now, has := tips[ch.Name]
		switch {
		case had && !has:
			return fmt.Errorf("%w: chain %q has no recorded tip, but this node's witness file %s recorded its tip at counter %d (hash %s…)",
				ErrRollbackDetected, ch.Name, c.cfg.WitnessFile, old.Counter, prefix(old.Hash, 16))
		case had && int64(now.Counter) < old.Counter:
			return fmt.Errorf("%w: chain %q's tip is at counter %d, but this node's witness file %s recorded counter %d: the database was restored from an older snapshot",
				ErrRollbackDetected, ch.Name, now.Counter, c.cfg.WitnessFile, old.Counter)
		case had && int64(now.Counter) == old.Counter && hex.EncodeToString(now.Hash) != old.Hash:
			return fmt.Errorf("%w: chain %q's tip at counter %d has hash %s, but this node's witness file %s recorded %s…",
				ErrRollbackDetected, ch.Name, now.Counter, shortHash(now.Hash), c.cfg.WitnessFile, prefix(old.Hash, 16))
		case had && int64(now.Counter) > old.Counter:
			// Higher is not enough: a database that lost the last commits
			// (a restore, a failover to a standby behind the primary) and
			// then went on writing reaches the same heights with other
			// rows. The row this node saw at the tip must still be there.
			rows, err := c.chains.ChainRows(ctx, ch, uint64(old.Counter))
			if err != nil {
				return err
			}
			if !rows.Found || hex.EncodeToString(rows.Hash) != old.Hash {
				have := "no row"
				if rows.Found {
					have = "a row with hash " + shortHash(rows.Hash)
				}
				return fmt.Errorf("%w: chain %q's table %s has %s at counter %d, but this node's witness file %s recorded the tip there with hash %s…: the database lost commits this node saw (restored, or failed over to a standby that had not received them) and went on with another history",
					ErrRollbackDetected, ch.Name, ch.Table, have, old.Counter, c.cfg.WitnessFile, prefix(old.Hash, 16))
			}
			w.Chains[ch.Name] = witnessTip{Counter: int64(now.Counter), Hash: hex.EncodeToString(now.Hash)}
		case has:
			w.Chains[ch.Name] = witnessTip{Counter: int64(now.Counter), Hash: hex.EncodeToString(now.Hash)}
		}
		// The database settles what was pending: committed if the tip
		// reached it, otherwise rolled back (or restored to a point just
		// before it, which no check can tell apart).
		delete(w.Pending, ch.Name)
		delete(c.wit.pendingTx, ch.Name)
	}
	if err := writeWitness(c.cfg.WitnessFile, w); err != nil {
		return err
	}
	c.wit.w = w
	return nil
}

func prefix(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
