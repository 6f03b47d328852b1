-- sqlfence/cluster schema for SQLite 3.42 or later, version 3.
-- {{prefix}} is replaced by Config.TablePrefix (validated, default "cluster_").
-- Times are unix milliseconds by the clock of the host that writes them.
-- A statement ends at a line that starts in column 0 and ends with ";".
--
-- The file is idempotent and describes the whole current schema: New runs
-- it, in one BEGIN IMMEDIATE transaction, only when {{prefix}}schema_version
-- records an older version; triggers are dropped and created again so a
-- changed body reaches every existing database.
--
-- Guard errors start with "sqlfence SFnnn:", which the package maps to its
-- sentinel errors:
--   SF001 stale fencing token          SF002 chain tip moving backwards
--   SF003 chain tip deleted or renamed SF004 lease deleted or renamed
--   SF005 chain tip rewritten          SF006 fencing token lowered
--   SF007 fencing token below the high-water mark (a lease or lane row went
--         back)                      SF008 lane deleted or renamed
--   SF009 a lease or lane changing hands under the same fencing token
-- REPLACE deletes the row it replaces without firing delete triggers, so
-- every insert is checked against the row it may replace and against the
-- high-water marks. Trigger bodies in the main schema only see tables of
-- the main schema, so a TEMP table cannot stand in for ours.

CREATE TABLE IF NOT EXISTS {{prefix}}schema_version (
    version    INTEGER PRIMARY KEY,
    applied_at INTEGER NOT NULL
);

-- One row per lease name. The fencing token only ever grows: it is
-- incremented by every acquisition and kept by release and expiry.
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

-- The highest fencing token ever granted per lease ('lease/<name>') and the
-- highest counter ever recorded per chain tip ('chain/<name>').
CREATE TABLE IF NOT EXISTS {{prefix}}high_water (
    scope TEXT    NOT NULL PRIMARY KEY,
    value INTEGER NOT NULL CHECK (value >= 0)
);

DROP TRIGGER IF EXISTS {{prefix}}high_water_insert;

CREATE TRIGGER {{prefix}}high_water_insert
BEFORE INSERT ON {{prefix}}high_water FOR EACH ROW
BEGIN
    SELECT RAISE(ABORT, 'sqlfence SF006: a high-water mark may not go back')
    WHERE NEW.value < (SELECT value FROM {{prefix}}high_water WHERE scope = NEW.scope);
END;

DROP TRIGGER IF EXISTS {{prefix}}high_water_update;

CREATE TRIGGER {{prefix}}high_water_update
BEFORE UPDATE ON {{prefix}}high_water FOR EACH ROW
WHEN NEW.scope IS NOT OLD.scope OR NEW.value < OLD.value
BEGIN
    SELECT RAISE(ABORT, 'sqlfence SF006: a high-water mark may not go back');
END;

DROP TRIGGER IF EXISTS {{prefix}}high_water_delete;

CREATE TRIGGER {{prefix}}high_water_delete
BEFORE DELETE ON {{prefix}}high_water FOR EACH ROW
BEGIN
    SELECT RAISE(ABORT, 'sqlfence SF006: a high-water mark may not be deleted');
END;

-- Fencing tokens must never go back or be granted twice. An insert (a
-- first grant, or a REPLACE, which skips the delete guard) must propose a
-- token above every token granted: REPLACE at the current token would
-- hand the term to another holder under it (SF009).
DROP TRIGGER IF EXISTS {{prefix}}lease_guard_insert;

CREATE TRIGGER {{prefix}}lease_guard_insert
BEFORE INSERT ON {{prefix}}lease FOR EACH ROW
BEGIN
    SELECT RAISE(ABORT, 'sqlfence SF007: a fencing token below the high-water mark: the lease row went back')
    WHERE NEW.fencing_token < (SELECT value FROM {{prefix}}high_water WHERE scope = 'lease/' || NEW.name);
    SELECT RAISE(ABORT, 'sqlfence SF009: a fencing token already granted may not be granted again: a new holder needs a new token')
    WHERE NEW.fencing_token = (SELECT value FROM {{prefix}}high_water WHERE scope = 'lease/' || NEW.name);
END;

DROP TRIGGER IF EXISTS {{prefix}}lease_guard_update;

CREATE TRIGGER {{prefix}}lease_guard_update
BEFORE UPDATE ON {{prefix}}lease FOR EACH ROW
BEGIN
    SELECT RAISE(ABORT, 'sqlfence SF004: a lease may not be renamed')
    WHERE NEW.name IS NOT OLD.name;
    SELECT RAISE(ABORT, 'sqlfence SF006: a fencing token may not go back')
    WHERE NEW.fencing_token < OLD.fencing_token;
    SELECT RAISE(ABORT, 'sqlfence SF009: a lease may not change hands under the same fencing token: a new holder needs a new token')
    WHERE NEW.fencing_token = OLD.fencing_token
      AND (NEW.holder IS NOT OLD.holder OR NEW.instance IS NOT OLD.instance)
      AND NOT (NEW.holder = '' AND NEW.instance = ''
               AND NEW.expires_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER));
    SELECT RAISE(ABORT, 'sqlfence SF007: a fencing token below the high-water mark: the lease row went back')
    WHERE NEW.fencing_token > OLD.fencing_token
      AND NEW.fencing_token < (SELECT value FROM {{prefix}}high_water WHERE scope = 'lease/' || NEW.name);
END;

DROP TRIGGER IF EXISTS {{prefix}}lease_guard_delete;

CREATE TRIGGER {{prefix}}lease_guard_delete
BEFORE DELETE ON {{prefix}}lease FOR EACH ROW
BEGIN
    SELECT RAISE(ABORT, 'sqlfence SF004: a lease may not be deleted: its fencing tokens would start again at 1');
END;

DROP TRIGGER IF EXISTS {{prefix}}lease_mark_insert;

CREATE TRIGGER {{prefix}}lease_mark_insert
AFTER INSERT ON {{prefix}}lease FOR EACH ROW
BEGIN
    INSERT INTO {{prefix}}high_water (scope, value) VALUES ('lease/' || NEW.name, NEW.fencing_token)
    ON CONFLICT (scope) DO UPDATE SET value = excluded.value WHERE value < excluded.value;
END;

DROP TRIGGER IF EXISTS {{prefix}}lease_mark_update;

CREATE TRIGGER {{prefix}}lease_mark_update
AFTER UPDATE ON {{prefix}}lease FOR EACH ROW
WHEN NEW.fencing_token > OLD.fencing_token
BEGIN
    INSERT INTO {{prefix}}high_water (scope, value) VALUES ('lease/' || NEW.name, NEW.fencing_token)
    ON CONFLICT (scope) DO UPDATE SET value = excluded.value WHERE value < excluded.value;
END;

-- The recorded tip of each hash-chained table. The guards below make the
-- database itself refuse a tip written under a stale fencing token, moving
-- backwards, rewritten at the same counter, renamed or deleted.
CREATE TABLE IF NOT EXISTS {{prefix}}chain_tips (
    scope         TEXT    NOT NULL PRIMARY KEY,
    lease_name    TEXT    NOT NULL,
    at_counter    INTEGER NOT NULL CHECK (at_counter >= 0),
    row_hash      BLOB    NOT NULL,
    fencing_token INTEGER NOT NULL CHECK (fencing_token > 0),
    updated_at    INTEGER NOT NULL
);

INSERT INTO {{prefix}}high_water (scope, value)
SELECT 'chain/' || t.scope, t.at_counter FROM {{prefix}}chain_tips t
WHERE NOT EXISTS (SELECT 1 FROM {{prefix}}high_water WHERE scope = 'chain/' || t.scope);

DROP TRIGGER IF EXISTS {{prefix}}chain_tips_guard_insert;

CREATE TRIGGER {{prefix}}chain_tips_guard_insert
BEFORE INSERT ON {{prefix}}chain_tips FOR EACH ROW
BEGIN
    SELECT RAISE(ABORT, 'sqlfence SF001: stale fencing token')
    WHERE NOT EXISTS (
        SELECT 1 FROM {{prefix}}lease
        WHERE name = NEW.lease_name AND fencing_token = NEW.fencing_token
          AND expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER))
       OR NEW.fencing_token < (SELECT fencing_token FROM {{prefix}}chain_tips WHERE scope = NEW.scope);
    SELECT RAISE(ABORT, 'sqlfence SF002: chain tip moving backwards')
    WHERE NEW.at_counter < (SELECT at_counter FROM {{prefix}}chain_tips WHERE scope = NEW.scope)
       OR NEW.at_counter < (SELECT value FROM {{prefix}}high_water WHERE scope = 'chain/' || NEW.scope);
    SELECT RAISE(ABORT, 'sqlfence SF005: a chain tip may not be rewritten with another hash')
    WHERE EXISTS (
        SELECT 1 FROM {{prefix}}chain_tips
        WHERE scope = NEW.scope AND at_counter = NEW.at_counter AND row_hash IS NOT NEW.row_hash);
    SELECT RAISE(ABORT, 'sqlfence SF003: a chain tip may not move to another lease')
    WHERE EXISTS (
        SELECT 1 FROM {{prefix}}chain_tips WHERE scope = NEW.scope AND lease_name IS NOT NEW.lease_name);
END;

DROP TRIGGER IF EXISTS {{prefix}}chain_tips_guard_update;

CREATE TRIGGER {{prefix}}chain_tips_guard_update
BEFORE UPDATE ON {{prefix}}chain_tips FOR EACH ROW
BEGIN
    SELECT RAISE(ABORT, 'sqlfence SF003: a chain tip may not be renamed')
    WHERE NEW.scope IS NOT OLD.scope;
    -- A tip keeps its lease: moved to another lease row, one any writer
    -- may insert with any token, it would be written under a token no
    -- real term holds (version 3).
    SELECT RAISE(ABORT, 'sqlfence SF003: a chain tip may not move to another lease')
    WHERE NEW.lease_name IS NOT OLD.lease_name;
    SELECT RAISE(ABORT, 'sqlfence SF001: stale fencing token')
    WHERE NEW.fencing_token < OLD.fencing_token OR NOT EXISTS (
        SELECT 1 FROM {{prefix}}lease
        WHERE name = NEW.lease_name AND fencing_token = NEW.fencing_token
          AND expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER));
    SELECT RAISE(ABORT, 'sqlfence SF002: chain tip moving backwards')
    WHERE NEW.at_counter < OLD.at_counter
       OR NEW.at_counter < (SELECT value FROM {{prefix}}high_water WHERE scope = 'chain/' || NEW.scope);
    SELECT RAISE(ABORT, 'sqlfence SF005: a chain tip may not be rewritten with another hash')
    WHERE NEW.at_counter = OLD.at_counter AND NEW.row_hash IS NOT OLD.row_hash;
END;

DROP TRIGGER IF EXISTS {{prefix}}chain_tips_guard_delete;

CREATE TRIGGER {{prefix}}chain_tips_guard_delete
BEFORE DELETE ON {{prefix}}chain_tips FOR EACH ROW
BEGIN
    SELECT RAISE(ABORT, 'sqlfence SF003: chain tips may not be deleted');
END;

DROP TRIGGER IF EXISTS {{prefix}}chain_tips_mark_insert;

CREATE TRIGGER {{prefix}}chain_tips_mark_insert
AFTER INSERT ON {{prefix}}chain_tips FOR EACH ROW
BEGIN
    INSERT INTO {{prefix}}high_water (scope, value) VALUES ('chain/' || NEW.scope, NEW.at_counter)
    ON CONFLICT (scope) DO UPDATE SET value = excluded.value WHERE value < excluded.value;
END;

DROP TRIGGER IF EXISTS {{prefix}}chain_tips_mark_update;

CREATE TRIGGER {{prefix}}chain_tips_mark_update
AFTER UPDATE ON {{prefix}}chain_tips FOR EACH ROW
WHEN NEW.at_counter > OLD.at_counter
BEGIN
    INSERT INTO {{prefix}}high_water (scope, value) VALUES ('chain/' || NEW.scope, NEW.at_counter)
    ON CONFLICT (scope) DO UPDATE SET value = excluded.value WHERE value < excluded.value;
END;

-- Cluster-wide facts every node must agree on, one row per lease name.
CREATE TABLE IF NOT EXISTS {{prefix}}state (
    scope            TEXT    NOT NULL PRIMARY KEY,
    vault_key_fp     TEXT    NOT NULL,
    rotation_epoch   INTEGER NOT NULL DEFAULT 0,
    recorded_at      INTEGER NOT NULL,
    recorded_by_node TEXT    NOT NULL
);

-- Membership: one row per node process (instance) and lease name, written
-- at start, refreshed every few heartbeats, marked 'left' on Shutdown.
-- Liveness is judged from last_seen; which member leads, from the lease row.
CREATE TABLE IF NOT EXISTS {{prefix}}nodes (
    scope      TEXT    NOT NULL,
    instance   TEXT    NOT NULL,
    node_id    TEXT    NOT NULL,
    host       TEXT    NOT NULL,
    pid        INTEGER NOT NULL,
    endpoint   TEXT    NOT NULL DEFAULT '',
    started_at INTEGER NOT NULL,
    last_seen  INTEGER NOT NULL,
    status     TEXT    NOT NULL CHECK (status IN ('active', 'left')),
    -- 1 once the node claimed a lane: it counts towards the lanes' fair share.
    takes_lanes INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, instance)
);

-- Version 2: every member records its node timeout (its LeaseTTL and three
-- heartbeats, in ms), by which its own liveness is judged, so every reader
-- (Members, MembersHandler, clusterctl) agrees; 0 in a row written before.
-- SQLite has no ADD COLUMN IF NOT EXISTS: New takes "duplicate column
-- name" for the column being there already.
ALTER TABLE {{prefix}}nodes ADD COLUMN timeout_ms INTEGER NOT NULL DEFAULT 0;

-- Lanes: partitioned work. One row per lane key of a lease name (scope),
-- naming the node process (instance) that owns the lane until expires_at
-- under a fencing token of the lane's own: it grows with every new claim and
-- is kept by renewal, release and expiry. A row with token 0 is a lane never
-- claimed. Rows are never deleted, so a key claimed again continues from its
-- token; the highest token each lane was granted is kept in high_water under
-- 'lane/<length of scope>/<scope>/<lane>' (the length keeps two scope and
-- lane pairs from sharing a mark).
CREATE TABLE IF NOT EXISTS {{prefix}}lanes (
    scope         TEXT    NOT NULL,
    lane          TEXT    NOT NULL,
    holder        TEXT    NOT NULL,
    instance      TEXT    NOT NULL,
    fencing_token INTEGER NOT NULL CHECK (fencing_token >= 0),
    acquired_at   INTEGER NOT NULL,
    renewed_at    INTEGER NOT NULL,
    expires_at    INTEGER NOT NULL,
    PRIMARY KEY (scope, lane)
);

-- What a claim and a keeper's heartbeat count reads only the
-- lanes held now or within the fair share's window, however many keys
-- the scope ever used (rows are never deleted): an instance's unexpired
-- lanes, and the lanes renewed or released since a moment.
CREATE INDEX IF NOT EXISTS {{prefix}}lanes_by_holding ON {{prefix}}lanes (scope, instance, expires_at);

CREATE INDEX IF NOT EXISTS {{prefix}}lanes_by_renewal ON {{prefix}}lanes (scope, renewed_at);

-- REPLACE skips the delete guard: the insert guard requires a claimed
-- token above the lane's high-water mark (at the mark: SF009).
DROP TRIGGER IF EXISTS {{prefix}}lanes_guard_insert;

CREATE TRIGGER {{prefix}}lanes_guard_insert
BEFORE INSERT ON {{prefix}}lanes FOR EACH ROW
BEGIN
    SELECT RAISE(ABORT, 'sqlfence SF007: a lane fencing token below the high-water mark: the lane row went back')
    WHERE NEW.fencing_token <> 0
      AND NEW.fencing_token < (SELECT value FROM {{prefix}}high_water
                               WHERE scope = 'lane/' || length(NEW.scope) || '/' || NEW.scope || '/' || NEW.lane);
    SELECT RAISE(ABORT, 'sqlfence SF009: a lane fencing token already granted may not be granted again: a new holder needs a new token')
    WHERE NEW.fencing_token <> 0
      AND NEW.fencing_token = (SELECT value FROM {{prefix}}high_water
                               WHERE scope = 'lane/' || length(NEW.scope) || '/' || NEW.scope || '/' || NEW.lane);
END;

DROP TRIGGER IF EXISTS {{prefix}}lanes_guard_update;

CREATE TRIGGER {{prefix}}lanes_guard_update
BEFORE UPDATE ON {{prefix}}lanes FOR EACH ROW
BEGIN
    SELECT RAISE(ABORT, 'sqlfence SF008: a lane may not be renamed')
    WHERE NEW.scope IS NOT OLD.scope OR NEW.lane IS NOT OLD.lane;
    SELECT RAISE(ABORT, 'sqlfence SF006: a lane fencing token may not go back')
    WHERE NEW.fencing_token < OLD.fencing_token;
    SELECT RAISE(ABORT, 'sqlfence SF009: a lane may not change hands under the same fencing token: a new holder needs a new token')
    WHERE NEW.fencing_token = OLD.fencing_token
      AND (NEW.holder IS NOT OLD.holder OR NEW.instance IS NOT OLD.instance);
    SELECT RAISE(ABORT, 'sqlfence SF007: a lane fencing token below the high-water mark: the lane row went back')
    WHERE NEW.fencing_token > OLD.fencing_token
      AND NEW.fencing_token < (SELECT value FROM {{prefix}}high_water
                               WHERE scope = 'lane/' || length(NEW.scope) || '/' || NEW.scope || '/' || NEW.lane);
END;

DROP TRIGGER IF EXISTS {{prefix}}lanes_guard_delete;

CREATE TRIGGER {{prefix}}lanes_guard_delete
BEFORE DELETE ON {{prefix}}lanes FOR EACH ROW
BEGIN
    SELECT RAISE(ABORT, 'sqlfence SF008: a lane may not be deleted: its fencing tokens would start again at 1');
END;

DROP TRIGGER IF EXISTS {{prefix}}lanes_mark_insert;

CREATE TRIGGER {{prefix}}lanes_mark_insert
AFTER INSERT ON {{prefix}}lanes FOR EACH ROW
WHEN NEW.fencing_token > 0
BEGIN
    INSERT INTO {{prefix}}high_water (scope, value)
    VALUES ('lane/' || length(NEW.scope) || '/' || NEW.scope || '/' || NEW.lane, NEW.fencing_token)
    ON CONFLICT (scope) DO UPDATE SET value = excluded.value WHERE value < excluded.value;
END;

DROP TRIGGER IF EXISTS {{prefix}}lanes_mark_update;

CREATE TRIGGER {{prefix}}lanes_mark_update
AFTER UPDATE ON {{prefix}}lanes FOR EACH ROW
WHEN NEW.fencing_token > OLD.fencing_token
BEGIN
    INSERT INTO {{prefix}}high_water (scope, value)
    VALUES ('lane/' || length(NEW.scope) || '/' || NEW.scope || '/' || NEW.lane, NEW.fencing_token)
    ON CONFLICT (scope) DO UPDATE SET value = excluded.value WHERE value < excluded.value;
END;

-- The configuration version of each lease name (scope): nodes learn of a
-- change by seeing it grow. It never goes back and is never deleted.
CREATE TABLE IF NOT EXISTS {{prefix}}config (
    scope          TEXT    NOT NULL PRIMARY KEY,
    config_version INTEGER NOT NULL CHECK (config_version >= 0),
    updated_at     INTEGER NOT NULL
);

DROP TRIGGER IF EXISTS {{prefix}}config_guard_insert;

CREATE TRIGGER {{prefix}}config_guard_insert
BEFORE INSERT ON {{prefix}}config FOR EACH ROW
BEGIN
    SELECT RAISE(ABORT, 'sqlfence SF006: a config version may not go back')
    WHERE NEW.config_version < (SELECT config_version FROM {{prefix}}config WHERE scope = NEW.scope);
END;

DROP TRIGGER IF EXISTS {{prefix}}config_guard_update;

CREATE TRIGGER {{prefix}}config_guard_update
BEFORE UPDATE ON {{prefix}}config FOR EACH ROW
WHEN NEW.scope IS NOT OLD.scope OR NEW.config_version < OLD.config_version
BEGIN
    SELECT RAISE(ABORT, 'sqlfence SF006: a config version may not go back');
END;

DROP TRIGGER IF EXISTS {{prefix}}config_guard_delete;

CREATE TRIGGER {{prefix}}config_guard_delete
BEFORE DELETE ON {{prefix}}config FOR EACH ROW
BEGIN
    SELECT RAISE(ABORT, 'sqlfence SF006: a config version may not be deleted');
END;
