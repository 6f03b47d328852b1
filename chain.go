package cluster

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"regexp"

	"github.com/sqlfence/cluster/provider"
)

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
// the current unexpired lease (an error wrapping [ErrStaleFencingToken]),
// if counter is below the recorded tip or the highest it ever reached
// ([ErrTipBackwards]), or if counter is the tip's with another hash
// ([ErrTipRewritten]); triggers on the tip table enforce this, so a raw
// UPDATE cannot bypass them. Like [Cluster.Fence], it holds the lease row
// until tx ends. With [Config.WitnessFile] it also records the tip in the
// witness file (one more tip read and an fsync).
func (c *Cluster) AdvanceTip(ctx context.Context, tx Tx, chain string, counter uint64, rowHash []byte) error {
	if c.isDefault() {
		return stdAdvanceTip(ctx, tx, chain, counter, rowHash)
	}
	q, err := querierOf("AdvanceTip", tx)
	if err != nil {
		return err
	}
	if c.chains == nil {
		return c.errNoCapability("AdvanceTip", "ChainStore")
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
	var before provider.ChainTip
	var had bool
	if c.cfg.WitnessFile != "" {
		// The tip this transaction sees before writing is committed (or
		// this transaction's own): the witness may count on it.
		if before, had, err = c.chains.ReadTip(ctx, q, chain); err != nil {
			return err
		}
	}
	tip := provider.ChainTip{Chain: chain, Lease: c.cfg.LeaseName, Counter: counter, Hash: rowHash, FencingToken: t.lease.FencingToken}
	if err := c.chains.WriteTip(ctx, q, tip); err != nil {
		return err
	}
	if c.cfg.WitnessFile != "" {
		if err := c.witnessTip(q, before, had, tip); err != nil {
			return fmt.Errorf("cluster: advance tip of chain %q to %d: %w; roll the transaction back", chain, counter, err)
		}
	}
	return nil
}

func (c *Cluster) hasChain(name string) bool {
	for _, ch := range c.cfg.Chains {
		if ch.Name == name {
			return true
		}
	}
	return false
}
