-- compat: expand: the same behaviour as migration 4, only faster.
-- outbox_wake as a SQL function, with migration 4's behaviour unchanged.
--
-- PostgreSQL inlines a SQL function whose body is one expression into the statement
-- that calls it, so the producer's enqueue statement no longer pays for a PL/pgSQL
-- call: at 16 producers on 2 cores that call cost about 7% of commits/s (pgbench,
-- the enqueue statement with and without it).
--
-- CASE evaluates its branches in order and stops at the first that holds, so the
-- lock is tried only when notifications are on, and pg_notify runs only when the
-- lock could not be had: a relay is idle, or about to be.
CREATE OR REPLACE FUNCTION {{schema}}.outbox_wake() RETURNS boolean
LANGUAGE sql VOLATILE
AS $fn$
SELECT CASE
    WHEN coalesce(current_setting('pgoutbox.notify', true), '') = 'off' THEN false
    -- No relay is idle, and none can go idle before this transaction ends.
    WHEN pg_try_advisory_xact_lock_shared(hashtext('pgoutbox.idle'), hashtext({{schema_name}})) THEN false
    -- pg_notify returns void, which is not NULL: this branch notifies and is true.
    ELSE pg_notify(
        CASE WHEN octet_length('pgoutbox.' || {{schema_name}}) > 63
             THEN 'pgoutbox.' || md5({{schema_name}})
             ELSE 'pgoutbox.' || {{schema_name}} END,
        '') IS NOT NULL
END
$fn$;
