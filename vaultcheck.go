package cluster

import (
	"context"
	"crypto/subtle"
	"fmt"
	"time"
)

// checkVaultKeys compares this node's vault-key fingerprint with the one
// the cluster recorded, recording it first if this node boots first. With
// AcceptVaultKeyRotation it advances the recorded fingerprint instead of
// refusing, by compare-and-set, so nodes rotating at once bump the epoch
// once.
func (c *Cluster) checkVaultKeys(ctx context.Context) error {
	fp := c.cfg.VaultKeyFingerprint
	if fp == "" || c.db == nil {
		return nil
	}
	p, scope, node := c.db, c.cfg.LeaseName, c.cfg.NodeID
	if _, err := p.db.ExecContext(ctx, p.q["state_insert"], scope, fp, node); err != nil {
		return p.wrap("record vault key fingerprint", err)
	}
	for attempt := 0; ; attempt++ {
		var stored, by string
		var epoch, at int64
		if err := p.db.QueryRowContext(ctx, p.q["state_read"], scope).Scan(&stored, &epoch, &at, &by); err != nil {
			return p.wrap("read vault key fingerprint", err)
		}
		if subtle.ConstantTimeCompare([]byte(fp), []byte(stored)) == 1 {
			c.log.DebugContext(ctx, "cluster: vault keys match the cluster", "vault_key_fp", prefix(fp, 16), "rotation_epoch", epoch)
			return nil
		}
		drift := func(why string) error {
			return fmt.Errorf("%w: node %q holds vault keys with fingerprint %s…, but node %q recorded %s… for the cluster at %s (rotation epoch %d); %s",
				ErrVaultKeyDrift, node, prefix(fp, 16), by, prefix(stored, 16), time.UnixMilli(at).UTC().Format(time.RFC3339), epoch, why)
		}
		switch {
		case !c.cfg.AcceptVaultKeyRotation:
			return drift("this node would seal data the others cannot open. If the keys were rotated on purpose, set AcceptVaultKeyRotation and ExpectedVaultKeyFingerprint")
		case c.cfg.ExpectedVaultKeyFingerprint != "" && subtle.ConstantTimeCompare([]byte(fp), []byte(c.cfg.ExpectedVaultKeyFingerprint)) != 1:
			return drift(fmt.Sprintf("a rotation is accepted only to the blessed ExpectedVaultKeyFingerprint %s…: is this node's key file stale or mistyped?", prefix(c.cfg.ExpectedVaultKeyFingerprint, 16)))
		case attempt > 0:
			return drift("another node rotated the cluster to other keys at the same time")
		}
		res, err := p.db.ExecContext(ctx, p.q["state_rotate"], fp, node, scope, stored)
		if err != nil {
			return p.wrap("rotate vault key fingerprint", err)
		}
		if n, err := res.RowsAffected(); err == nil && n == 1 {
			reason := fmt.Sprintf("vault key fingerprint %s… replaced %s…, rotation epoch %d", prefix(fp, 16), prefix(stored, 16), epoch+1)
			c.log.WarnContext(ctx, "cluster: vault keys rotated", "vault_key_fp", prefix(fp, 16), "previous_vault_key_fp", prefix(stored, 16), "rotation_epoch", epoch+1)
			c.emit(EventVaultKeyRotated, 0, reason)
			return nil
		}
		// Another node changed the row first; read what it wrote.
	}
}
