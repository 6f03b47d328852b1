-- Queries of the default provider on PostgreSQL. Each starts at a
-- "-- name:" line; the same name does the same thing in every dialect.
-- The clock CTE reads clock_timestamp() once, so one statement sees one
-- instant (now() would be the start of the transaction).

-- name: acquire
-- $1 name, $2 holder, $3 instance, $4 ttl ms, $5 endpoint.
-- Grants a new term if the lease is free or expired, else reports the holder.
WITH clock AS (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
), granted AS (
    INSERT INTO {{prefix}}lease AS l
        (name, holder, instance, fencing_token, acquired_at, renewed_at, expires_at, endpoint)
    SELECT $1, $2, $3, 1, now_ms, now_ms, now_ms + $4::bigint, $5 FROM clock
    ON CONFLICT (name) DO UPDATE SET
        holder        = excluded.holder,
        instance      = excluded.instance,
        fencing_token = l.fencing_token + 1,
        acquired_at   = excluded.acquired_at,
        renewed_at    = excluded.renewed_at,
        expires_at    = excluded.expires_at,
        endpoint      = excluded.endpoint
    WHERE l.expires_at <= excluded.acquired_at
    RETURNING l.holder, l.instance, l.fencing_token, l.expires_at, l.endpoint
)
SELECT true, g.holder, g.instance, g.fencing_token, g.expires_at, g.endpoint, c.now_ms
FROM granted g, clock c
UNION ALL
SELECT false, l.holder, l.instance, l.fencing_token, l.expires_at, l.endpoint, c.now_ms
FROM {{prefix}}lease l, clock c
WHERE l.name = $1 AND NOT EXISTS (SELECT 1 FROM granted);

-- name: renew
-- $1 name, $2 holder, $3 instance, $4 fencing token, $5 ttl ms.
WITH clock AS (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
)
UPDATE {{prefix}}lease AS l
SET renewed_at = c.now_ms, expires_at = c.now_ms + $5::bigint
FROM clock c
WHERE l.name = $1 AND l.holder = $2 AND l.instance = $3 AND l.fencing_token = $4
  AND l.expires_at > c.now_ms
RETURNING l.expires_at;

-- name: release
-- $1 name, $2 holder, $3 instance, $4 fencing token (0: any term of the instance).
WITH clock AS (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
)
UPDATE {{prefix}}lease AS l
SET renewed_at = c.now_ms, expires_at = c.now_ms
FROM clock c
WHERE l.name = $1 AND l.holder = $2 AND l.instance = $3
  AND ($4::bigint = 0 OR l.fencing_token = $4::bigint)
  AND l.expires_at > c.now_ms;

-- name: leader
-- $1 name.
SELECT holder, instance, fencing_token, expires_at, endpoint,
       floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
FROM {{prefix}}lease WHERE name = $1;
