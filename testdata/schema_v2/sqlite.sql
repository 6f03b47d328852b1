-- sqlfence/cluster schema for SQLite 3.42 or later.
-- {{prefix}} is replaced by Config.TablePrefix (validated, default "cluster_").
-- Times are unix milliseconds by the clock of the host that writes them.
-- A statement ends at a line that starts in column 0 and ends with ";".

CREATE TABLE IF NOT EXISTS {{prefix}}schema_version (
    version    INTEGER PRIMARY KEY,
    applied_at INTEGER NOT NULL
);

-- One row per lease name. The fencing token only ever grows: it is
-- incremented by every acquisition and kept by release and expiry.
-- The guard trigger (version 2) refuses deleting a row, which would
-- restart its tokens at 1, and lowering a token.
CREATE TABLE IF NOT EXISTS {{prefix}}lease (
    name          TEXT    NOT NULL PRIMARY KEY,
    holder        TEXT    NOT NULL,
    instance      TEXT    NOT NULL,
    fencing_token INTEGER NOT NULL CHECK (fencing_token >= 0),
    acquired_at   INTEGER NOT NULL,
    renewed_at    INTEGER NOT NULL,
    expires_at    INTEGER NOT NULL,
    endpoint      TEXT    NOT NULL DEFAULT ''
);

-- Version 2: a guard on the lease row, chain tips and cluster state.

-- Fencing tokens must never go back: refuse lowering one, and deleting a
-- lease row, which would restart its tokens at 1.
CREATE TRIGGER IF NOT EXISTS {{prefix}}lease_guard_update
BEFORE UPDATE ON {{prefix}}lease FOR EACH ROW
WHEN NEW.fencing_token < OLD.fencing_token
BEGIN
    SELECT RAISE(ABORT, 'sqlfence: a fencing token may not go back');
END;

CREATE TRIGGER IF NOT EXISTS {{prefix}}lease_guard_delete
BEFORE DELETE ON {{prefix}}lease FOR EACH ROW
BEGIN
    SELECT RAISE(ABORT, 'sqlfence: a lease may not be deleted: its fencing tokens would start again at 1');
END;

-- The recorded tip of each hash-chained table. The guard triggers below make
-- the database itself refuse a tip written under a stale fencing token or
-- moving backwards, so a paused old leader cannot extend a chain.
CREATE TABLE IF NOT EXISTS {{prefix}}chain_tips (
    scope         TEXT    NOT NULL PRIMARY KEY,
    lease_name    TEXT    NOT NULL,
    at_counter    INTEGER NOT NULL CHECK (at_counter >= 0),
    row_hash      BLOB    NOT NULL,
    fencing_token INTEGER NOT NULL CHECK (fencing_token > 0),
    updated_at    INTEGER NOT NULL
);

CREATE TRIGGER IF NOT EXISTS {{prefix}}chain_tips_guard_insert
BEFORE INSERT ON {{prefix}}chain_tips FOR EACH ROW
BEGIN
    SELECT RAISE(ABORT, 'sqlfence: stale fencing token')
    WHERE NOT EXISTS (
        SELECT 1 FROM {{prefix}}lease
        WHERE name = NEW.lease_name AND fencing_token = NEW.fencing_token
          AND expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER));
END;

CREATE TRIGGER IF NOT EXISTS {{prefix}}chain_tips_guard_update
BEFORE UPDATE ON {{prefix}}chain_tips FOR EACH ROW
BEGIN
    SELECT RAISE(ABORT, 'sqlfence: stale fencing token')
    WHERE NEW.fencing_token < OLD.fencing_token OR NOT EXISTS (
        SELECT 1 FROM {{prefix}}lease
        WHERE name = NEW.lease_name AND fencing_token = NEW.fencing_token
          AND expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER));
    SELECT RAISE(ABORT, 'sqlfence: chain tip moving backwards')
    WHERE NEW.at_counter < OLD.at_counter;
END;

CREATE TRIGGER IF NOT EXISTS {{prefix}}chain_tips_guard_delete
BEFORE DELETE ON {{prefix}}chain_tips FOR EACH ROW
BEGIN
    SELECT RAISE(ABORT, 'sqlfence: chain tips may not be deleted');
END;

-- Cluster-wide facts every node must agree on, one row per lease name.
CREATE TABLE IF NOT EXISTS {{prefix}}state (
    scope            TEXT    NOT NULL PRIMARY KEY,
    vault_key_fp     TEXT    NOT NULL,
    rotation_epoch   INTEGER NOT NULL DEFAULT 0,
    recorded_at      INTEGER NOT NULL,
    recorded_by_node TEXT    NOT NULL
);
