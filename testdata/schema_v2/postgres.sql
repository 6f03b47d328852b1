-- sqlfence/cluster schema for PostgreSQL 12 or later.
-- {{prefix}} is replaced by Config.TablePrefix (validated, default "cluster_").
-- Times are unix milliseconds by the database clock, clock_timestamp().
-- A statement ends at a line that starts in column 0 and ends with ";".

CREATE TABLE IF NOT EXISTS {{prefix}}schema_version (
    version    INTEGER PRIMARY KEY,
    applied_at BIGINT  NOT NULL
);

-- One row per lease name. The fencing token only ever grows: it is
-- incremented by every acquisition and kept by release and expiry.
-- The guard trigger (version 2) refuses deleting a row, which would
-- restart its tokens at 1, and lowering a token.
CREATE TABLE IF NOT EXISTS {{prefix}}lease (
    name          TEXT   PRIMARY KEY,
    holder        TEXT   NOT NULL,
    instance      TEXT   NOT NULL,
    fencing_token BIGINT NOT NULL CHECK (fencing_token >= 0),
    acquired_at   BIGINT NOT NULL,
    renewed_at    BIGINT NOT NULL,
    expires_at    BIGINT NOT NULL,
    endpoint      TEXT   NOT NULL DEFAULT ''
);

-- Version 2: a guard on the lease row, chain tips and cluster state.

-- Fencing tokens must never go back: refuse lowering one, and deleting a
-- lease row, which would restart its tokens at 1.
CREATE OR REPLACE FUNCTION {{prefix}}lease_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'sqlfence: lease % may not be deleted: its fencing tokens would start again at 1',
            OLD.name USING ERRCODE = 'SF004';
    END IF;
    IF NEW.fencing_token < OLD.fencing_token THEN
        RAISE EXCEPTION 'sqlfence: the fencing token of lease % may not go back from % to %',
            OLD.name, OLD.fencing_token, NEW.fencing_token USING ERRCODE = 'SF004';
    END IF;
    RETURN NEW;
END
$guard$;

DROP TRIGGER IF EXISTS {{prefix}}lease_guard ON {{prefix}}lease;

CREATE TRIGGER {{prefix}}lease_guard
    BEFORE UPDATE OR DELETE ON {{prefix}}lease
    FOR EACH ROW EXECUTE FUNCTION {{prefix}}lease_guard();

-- The recorded tip of each hash-chained table. The guard trigger below makes
-- the database itself refuse a tip written under a stale fencing token or
-- moving backwards, so a paused old leader cannot extend a chain.
CREATE TABLE IF NOT EXISTS {{prefix}}chain_tips (
    scope         TEXT   PRIMARY KEY,
    lease_name    TEXT   NOT NULL,
    at_counter    BIGINT NOT NULL CHECK (at_counter >= 0),
    row_hash      BYTEA  NOT NULL,
    fencing_token BIGINT NOT NULL CHECK (fencing_token > 0),
    updated_at    BIGINT NOT NULL
);

CREATE OR REPLACE FUNCTION {{prefix}}chain_tips_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
DECLARE
    cur_token   BIGINT;
    cur_expires BIGINT;
    now_ms      BIGINT := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'sqlfence: chain tip % may not be deleted', OLD.scope
            USING ERRCODE = 'SF003';
    END IF;
    -- FOR SHARE holds the lease row until this transaction ends, so no later
    -- term can be granted before this tip commits.
    SELECT fencing_token, expires_at INTO cur_token, cur_expires
        FROM {{prefix}}lease WHERE name = NEW.lease_name FOR SHARE;
    IF NOT FOUND OR NEW.fencing_token <> cur_token OR cur_expires <= now_ms THEN
        RAISE EXCEPTION 'sqlfence: stale fencing token % for chain % (current token %)',
            NEW.fencing_token, NEW.scope, cur_token USING ERRCODE = 'SF001';
    END IF;
    IF TG_OP = 'UPDATE' THEN
        IF NEW.fencing_token < OLD.fencing_token THEN
            RAISE EXCEPTION 'sqlfence: stale fencing token % for chain % (tip written under %)',
                NEW.fencing_token, NEW.scope, OLD.fencing_token USING ERRCODE = 'SF001';
        END IF;
        IF NEW.at_counter < OLD.at_counter THEN
            RAISE EXCEPTION 'sqlfence: chain % tip moving backwards from % to %',
                NEW.scope, OLD.at_counter, NEW.at_counter USING ERRCODE = 'SF002';
        END IF;
    END IF;
    RETURN NEW;
END
$guard$;

DROP TRIGGER IF EXISTS {{prefix}}chain_tips_guard ON {{prefix}}chain_tips;

CREATE TRIGGER {{prefix}}chain_tips_guard
    BEFORE INSERT OR UPDATE OR DELETE ON {{prefix}}chain_tips
    FOR EACH ROW EXECUTE FUNCTION {{prefix}}chain_tips_guard();

-- Cluster-wide facts every node must agree on, one row per lease name.
CREATE TABLE IF NOT EXISTS {{prefix}}state (
    scope            TEXT   PRIMARY KEY,
    vault_key_fp     TEXT   NOT NULL,
    rotation_epoch   BIGINT NOT NULL DEFAULT 0,
    recorded_at      BIGINT NOT NULL,
    recorded_by_node TEXT   NOT NULL
);
