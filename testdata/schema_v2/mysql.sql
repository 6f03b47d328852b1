-- sqlfence/cluster schema for MySQL 8.0 and MariaDB 10.5 or later (InnoDB).
-- {{prefix}} is replaced by Config.TablePrefix (validated, default "cluster_").
-- Times are unix milliseconds by the database clock, UTC_TIMESTAMP(6).
-- A statement ends at a line that starts in column 0 and ends with ";".

CREATE TABLE IF NOT EXISTS {{prefix}}schema_version (
    version    INT    NOT NULL PRIMARY KEY,
    applied_at BIGINT NOT NULL
) ENGINE=InnoDB;

-- One row per lease name. The fencing token only ever grows: it is
-- incremented by every acquisition and kept by release and expiry.
-- The guard trigger (version 2) refuses deleting a row, which would
-- restart its tokens at 1, and lowering a token.
CREATE TABLE IF NOT EXISTS {{prefix}}lease (
    name          VARCHAR(128)  NOT NULL PRIMARY KEY,
    holder        VARCHAR(255)  NOT NULL,
    instance      VARCHAR(64)   NOT NULL,
    fencing_token BIGINT        NOT NULL,
    acquired_at   BIGINT        NOT NULL,
    renewed_at    BIGINT        NOT NULL,
    expires_at    BIGINT        NOT NULL,
    endpoint      VARCHAR(2048) NOT NULL DEFAULT '',
    CONSTRAINT {{prefix}}lease_token_nonneg CHECK (fencing_token >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Version 2: a guard on the lease row, chain tips and cluster state.

-- Fencing tokens must never go back: refuse lowering one, and deleting a
-- lease row, which would restart its tokens at 1. An existing trigger
-- (error 1359) is kept: MySQL DDL is not transactional, so dropping and
-- recreating would leave a moment without the guard.
-- (With binary logging on, creating triggers needs the TRIGGER privilege and
-- SUPER or log_bin_trust_function_creators=1.)
CREATE TRIGGER {{prefix}}lease_guard_update
BEFORE UPDATE ON {{prefix}}lease FOR EACH ROW
BEGIN
    IF NEW.fencing_token < OLD.fencing_token THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'sqlfence: a fencing token may not go back';
    END IF;
END;

CREATE TRIGGER {{prefix}}lease_guard_delete
BEFORE DELETE ON {{prefix}}lease FOR EACH ROW
BEGIN
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'sqlfence: a lease may not be deleted: its fencing tokens would start again at 1';
END;

-- The recorded tip of each hash-chained table. The guard triggers below make
-- the database itself refuse a tip written under a stale fencing token or
-- moving backwards, so a paused old leader cannot extend a chain.
CREATE TABLE IF NOT EXISTS {{prefix}}chain_tips (
    scope         VARCHAR(128)   NOT NULL PRIMARY KEY,
    lease_name    VARCHAR(128)   NOT NULL,
    at_counter    BIGINT         NOT NULL,
    row_hash      VARBINARY(512) NOT NULL,
    fencing_token BIGINT         NOT NULL,
    updated_at    BIGINT         NOT NULL,
    CONSTRAINT {{prefix}}chain_tips_counter_nonneg CHECK (at_counter >= 0),
    CONSTRAINT {{prefix}}chain_tips_token_pos CHECK (fencing_token > 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TRIGGER {{prefix}}chain_tips_guard_insert
BEFORE INSERT ON {{prefix}}chain_tips FOR EACH ROW
BEGIN
    DECLARE cur_token BIGINT DEFAULT NULL;
    DECLARE cur_expires BIGINT DEFAULT NULL;
    -- A locking read holds the lease row until this transaction ends, so no
    -- later term can be granted before this tip commits.
    SELECT fencing_token, expires_at INTO cur_token, cur_expires
        FROM {{prefix}}lease WHERE name = NEW.lease_name LOCK IN SHARE MODE;
    IF cur_token IS NULL OR NEW.fencing_token <> cur_token
        OR cur_expires <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'sqlfence: stale fencing token';
    END IF;
END;

CREATE TRIGGER {{prefix}}chain_tips_guard_update
BEFORE UPDATE ON {{prefix}}chain_tips FOR EACH ROW
BEGIN
    DECLARE cur_token BIGINT DEFAULT NULL;
    DECLARE cur_expires BIGINT DEFAULT NULL;
    SELECT fencing_token, expires_at INTO cur_token, cur_expires
        FROM {{prefix}}lease WHERE name = NEW.lease_name LOCK IN SHARE MODE;
    IF cur_token IS NULL OR NEW.fencing_token <> cur_token OR NEW.fencing_token < OLD.fencing_token
        OR cur_expires <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'sqlfence: stale fencing token';
    END IF;
    IF NEW.at_counter < OLD.at_counter THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'sqlfence: chain tip moving backwards';
    END IF;
END;

CREATE TRIGGER {{prefix}}chain_tips_guard_delete
BEFORE DELETE ON {{prefix}}chain_tips FOR EACH ROW
BEGIN
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'sqlfence: chain tips may not be deleted';
END;

-- Cluster-wide facts every node must agree on, one row per lease name.
CREATE TABLE IF NOT EXISTS {{prefix}}state (
    scope            VARCHAR(128) NOT NULL PRIMARY KEY,
    vault_key_fp     VARCHAR(128) NOT NULL,
    rotation_epoch   BIGINT       NOT NULL DEFAULT 0,
    recorded_at      BIGINT       NOT NULL,
    recorded_by_node VARCHAR(255) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
