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
-- Never delete a row: that would restart its tokens at 1.
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
