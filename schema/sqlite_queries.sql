-- Queries of the default provider on SQLite. Each starts at a "-- name:"
-- line; the same name does the same thing in every dialect. SQLite's 'now'
-- is one instant for the whole statement.

-- name: acquire
-- ?1 name, ?2 holder, ?3 instance, ?4 ttl ms, ?5 endpoint.
-- Grants a new term if the lease is free or expired; returns no row if not.
INSERT INTO {{prefix}}lease
    (name, holder, instance, fencing_token, acquired_at, renewed_at, expires_at, endpoint)
SELECT ?1, ?2, ?3, 1, now_ms, now_ms, now_ms + ?4, ?5
FROM (SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER) AS now_ms) WHERE true
ON CONFLICT (name) DO UPDATE SET
    holder        = excluded.holder,
    instance      = excluded.instance,
    fencing_token = fencing_token + 1,
    acquired_at   = excluded.acquired_at,
    renewed_at    = excluded.renewed_at,
    expires_at    = excluded.expires_at,
    endpoint      = excluded.endpoint
WHERE expires_at <= excluded.acquired_at
RETURNING true, holder, instance, fencing_token, expires_at, endpoint, acquired_at;

-- name: renew
-- ?1 name, ?2 holder, ?3 instance, ?4 fencing token, ?5 ttl ms.
UPDATE {{prefix}}lease
SET renewed_at = CAST(unixepoch('subsec') * 1000 AS INTEGER),
    expires_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) + ?5
WHERE name = ?1 AND holder = ?2 AND instance = ?3 AND fencing_token = ?4
  AND expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER)
RETURNING expires_at;

-- name: release
-- ?1 name, ?2 holder, ?3 instance, ?4 fencing token (0: any term of the instance).
UPDATE {{prefix}}lease
SET renewed_at = CAST(unixepoch('subsec') * 1000 AS INTEGER),
    expires_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE name = ?1 AND holder = ?2 AND instance = ?3
  AND (?4 = 0 OR fencing_token = ?4)
  AND expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER);

-- name: leader
-- ?1 name.
SELECT holder, instance, fencing_token, expires_at, endpoint,
       CAST(unixepoch('subsec') * 1000 AS INTEGER)
FROM {{prefix}}lease WHERE name = ?1;
