package cluster

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"unicode"
)

// A Chain names a hash-chained, append-only table (an audit log, a consent
// log, a ledger) whose tip the cluster records and checks. Each row of the
// table has a monotonic counter and a hash of the row.
type Chain struct {
	// Name identifies the chain in the <prefix>chain_tips table. Required;
	// at most 128 bytes of printable UTF-8.
	Name string
	// Table is the chain's table, optionally qualified by its schema
	// ("audit.events"). Each part must match ^[a-z_][a-z0-9_]{0,62}$.
	Table string
	// CounterColumn holds the row's monotonic counter, an integer.
	// Default "monotonic_counter".
	CounterColumn string
	// HashColumn holds the row's hash, as bytes or text. Default "row_hash".
	HashColumn string
}

var (
	tablePattern  = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}(\.[a-z_][a-z0-9_]{0,62})?$`)
	columnPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
)

const maxRowHashLen = 512

// resolveChains returns a copy of chains with defaults applied, or the
// first rule one breaks.
func resolveChains(chains []Chain) ([]Chain, error) {
	out := make([]Chain, len(chains))
	seen := map[string]bool{}
	for i, ch := range chains {
		field := fmt.Sprintf("Chains[%d]", i)
		if ch.Name == "" {
			return nil, configErrorf("%s.Name is required", field)
		}
		if err := checkText(field+".Name", ch.Name, maxLeaseNameLen); err != nil {
			return nil, err
		}
		if seen[ch.Name] {
			return nil, configErrorf("%s.Name (%q) is used by another chain", field, ch.Name)
		}
		seen[ch.Name] = true
		if !tablePattern.MatchString(ch.Table) {
			return nil, configErrorf("%s.Table (%q) must match %s", field, ch.Table, tablePattern)
		}
		ch.CounterColumn = cmp.Or(ch.CounterColumn, "monotonic_counter")
		ch.HashColumn = cmp.Or(ch.HashColumn, "row_hash")
		if !columnPattern.MatchString(ch.CounterColumn) {
			return nil, configErrorf("%s.CounterColumn (%q) must match %s", field, ch.CounterColumn, columnPattern)
		}
		if !columnPattern.MatchString(ch.HashColumn) {
			return nil, configErrorf("%s.HashColumn (%q) must match %s", field, ch.HashColumn, columnPattern)
		}
		out[i] = ch
	}
	return out, nil
}

// AdvanceTip records, in the caller's transaction tx, that chain's tip is
// now the row with counter and rowHash, under this node's fencing token.
// Call it in the transaction that appends that row. The database itself
// refuses the write, failing the transaction, if the token is not that of
// the current unexpired lease (an error wrapping [ErrStaleFencingToken]) or
// if counter is below the recorded tip ([ErrTipBackwards]); a trigger on
// the tip table enforces both, so a raw UPDATE cannot bypass them. Like
// [Cluster.Fence], it holds the lease row until tx ends.
func (c *Cluster) AdvanceTip(ctx context.Context, tx DBTX, chain string, counter uint64, rowHash []byte) error {
	if c.db == nil {
		return errNoDatabase
	}
	if !c.hasChain(chain) {
		return fmt.Errorf("%w: chain %q is not in Config.Chains", ErrInvalidConfig, chain)
	}
	if counter > math.MaxInt64 {
		return fmt.Errorf("cluster: advance tip of chain %q: counter %d exceeds the largest BIGINT", chain, counter)
	}
	if len(rowHash) == 0 || len(rowHash) > maxRowHashLen {
		return fmt.Errorf("cluster: advance tip of chain %q: row hash is %d bytes, want 1 to %d", chain, len(rowHash), maxRowHashLen)
	}
	t, err := c.heldTerm()
	if err != nil {
		return err
	}
	var before tip
	var had bool
	if c.cfg.WitnessFile != "" {
		// The tip this transaction sees before writing is committed (or
		// this transaction's own): the witness may count on it.
		if before, had, err = c.db.readTip(ctx, tx, chain); err != nil {
			return err
		}
	}
	_, err = tx.ExecContext(ctx, c.db.q["tip_write"], chain, c.cfg.LeaseName, int64(counter), rowHash, int64(t.lease.FencingToken))
	if err != nil {
		return c.db.wrap(fmt.Sprintf("advance tip of chain %q to %d under fencing token %d", chain, counter, t.lease.FencingToken), err)
	}
	if c.cfg.WitnessFile != "" {
		if err := c.witnessTip(tx, chain, before, had, int64(counter), rowHash, t.lease.FencingToken); err != nil {
			return fmt.Errorf("cluster: advance tip of chain %q to %d: %w; roll the transaction back", chain, counter, err)
		}
	}
	return nil
}

// witnessTip records in the witness file what AdvanceTip just wrote in tx,
// as pending: tx may still roll back. The tip tx saw before writing is
// committed, unless it is the pending write of this same transaction, so
// it becomes the confirmed tip: a restore of the whole database to any
// point before this node's previous AdvanceTip is then caught at boot.
func (c *Cluster) witnessTip(tx DBTX, chain string, before tip, had bool, counter int64, hash []byte, token uint64) error {
	c.wit.mu.Lock()
	defer c.wit.mu.Unlock()
	w, err := c.loadWitness()
	if err != nil {
		return err
	}
	if had {
		seen := witnessTip{Counter: before.counter, Hash: hex.EncodeToString(before.hash)}
		ownPending := w.Pending[chain] == seen && c.wit.pendingTx[chain] == tx
		if old, ok := w.Chains[chain]; !ownPending && (!ok || seen.Counter > old.Counter) {
			w.Chains[chain] = seen
		}
	}
	w.Pending[chain] = witnessTip{Counter: counter, Hash: hex.EncodeToString(hash)}
	c.wit.pendingTx[chain] = tx
	w.Leases[c.cfg.LeaseName] = max(w.Leases[c.cfg.LeaseName], token)
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

func (c *Cluster) hasChain(name string) bool {
	for _, ch := range c.cfg.Chains {
		if ch.Name == name {
			return true
		}
	}
	return false
}

// tip is a recorded chain tip.
type tip struct {
	counter int64
	hash    []byte
	token   int64
}

func (p *dbProvider) readTip(ctx context.Context, q DBTX, scope string) (tip, bool, error) {
	var t tip
	err := q.QueryRowContext(ctx, p.q["tip_read"], scope).Scan(&t.counter, &t.hash, &t.token)
	if errors.Is(err, sql.ErrNoRows) {
		return t, false, nil
	}
	if err != nil {
		return t, false, p.wrap(fmt.Sprintf("read tip of chain %q", scope), err)
	}
	return t, true, nil
}

// readMark reads the high-water mark of scope ("lease/<name>" or
// "chain/<name>"), reporting whether there is one.
func (p *dbProvider) readMark(ctx context.Context, scope string) (int64, bool, error) {
	var v int64
	err := p.db.QueryRowContext(ctx, p.q["mark_read"], scope).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, p.wrap(fmt.Sprintf("read the high-water mark of %q", scope), err)
	}
	return v, true, nil
}

// checkChains compares each chain's recorded tip with its table and returns
// the tips it found. A table whose rows end below the tip lost rows; a row
// at the tip counter with another hash was substituted.
func (c *Cluster) checkChains(ctx context.Context) (map[string]tip, error) {
	p := c.db
	tips := map[string]tip{}
	for _, ch := range c.cfg.Chains {
		t, ok, err := p.readTip(ctx, p.db, ch.Name)
		if err != nil {
			return nil, err
		}
		mark, marked, err := p.readMark(ctx, "chain/"+ch.Name)
		if err != nil {
			return nil, err
		}
		switch {
		case marked && (!ok || t.counter < mark):
			have := "no recorded tip"
			if ok {
				have = fmt.Sprintf("its tip at counter %d", t.counter)
			}
			return nil, fmt.Errorf("%w: chain %q has %s, but the database once recorded counter %d for it (table %shigh_water): the chain tips were truncated or restored on their own",
				ErrRollbackDetected, ch.Name, have, mark, p.prefix)
		case !ok:
			continue // no tip yet: the chain has never advanced
		}
		tips[ch.Name] = t
		var top sql.NullInt64
		q := "SELECT MAX(" + ch.CounterColumn + ") FROM " + ch.Table
		if err := p.db.QueryRowContext(ctx, q).Scan(&top); err != nil {
			return nil, p.wrap(fmt.Sprintf("read the last counter of chain %q (table %s)", ch.Name, ch.Table), err)
		}
		if !top.Valid || top.Int64 < t.counter {
			have := "no rows"
			if top.Valid {
				have = fmt.Sprintf("rows up to counter %d", top.Int64)
			}
			return nil, fmt.Errorf("%w: chain %q: table %s has %s, below the recorded tip at counter %d (hash %s, fencing token %d): rows were deleted or the table was restored from an older snapshot",
				ErrRollbackDetected, ch.Name, ch.Table, have, t.counter, shortHash(t.hash), t.token)
		}
		var h []byte
		q = "SELECT " + ch.HashColumn + " FROM " + ch.Table + " WHERE " + ch.CounterColumn + " = " + p.placeholder(1)
		err = p.db.QueryRowContext(ctx, q, t.counter).Scan(&h)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, fmt.Errorf("%w: chain %q: table %s has no row at the recorded tip counter %d (its rows run to %d): a row was removed",
				ErrRollbackDetected, ch.Name, ch.Table, t.counter, top.Int64)
		}
		if err != nil {
			return nil, p.wrap(fmt.Sprintf("read the tip row of chain %q (table %s)", ch.Name, ch.Table), err)
		}
		if !bytes.Equal(h, t.hash) {
			return nil, fmt.Errorf("%w: chain %q: the row of table %s at counter %d has hash %s, the recorded tip at counter %d has %s: the row was substituted",
				ErrRollbackDetected, ch.Name, ch.Table, t.counter, shortHash(h), t.counter, shortHash(t.hash))
		}
	}
	return tips, nil
}

// placeholder returns the n-th bind parameter of the dialect.
func (p *dbProvider) placeholder(n int) string {
	if p.dialect == Postgres {
		return fmt.Sprintf("$%d", n)
	}
	return "?"
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
	w         *witness        // nil until first read
	pendingTx map[string]DBTX // chain → the transaction that wrote w.Pending[chain]
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

// checksRollback reports whether there is anything for verifyIntegrity to
// check: chains or a witness file, over the database provider.
func (c *Cluster) checksRollback() bool {
	return c.db != nil && (len(c.cfg.Chains) > 0 || c.cfg.WitnessFile != "")
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
		var r row
		conn, err := c.db.conn(ctx)
		if err != nil {
			return err
		}
		err = c.db.readRow(ctx, conn, name, &r)
		conn.Close()
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return c.db.wrap("read lease "+quote(name), err)
		}
		if uint64(r.token) < seen {
			return fmt.Errorf("%w: lease %q shows fencing token %d, but this node's witness file %s recorded token %d: the database was restored from an older snapshot and would issue used tokens again",
				ErrRollbackDetected, name, r.token, c.cfg.WitnessFile, seen)
		}
		w.Leases[name] = max(seen, uint64(r.token))
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
		case had && now.counter < old.Counter:
			return fmt.Errorf("%w: chain %q's tip is at counter %d, but this node's witness file %s recorded counter %d: the database was restored from an older snapshot",
				ErrRollbackDetected, ch.Name, now.counter, c.cfg.WitnessFile, old.Counter)
		case had && now.counter == old.Counter && hex.EncodeToString(now.hash) != old.Hash:
			return fmt.Errorf("%w: chain %q's tip at counter %d has hash %s, but this node's witness file %s recorded %s…",
				ErrRollbackDetected, ch.Name, now.counter, shortHash(now.hash), c.cfg.WitnessFile, prefix(old.Hash, 16))
		case has:
			w.Chains[ch.Name] = witnessTip{Counter: now.counter, Hash: hex.EncodeToString(now.hash)}
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
