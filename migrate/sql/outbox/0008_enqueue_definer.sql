-- compat: expand: outbox_enqueue keeps its signature and behaviour; only whose rights it runs with changes.
-- outbox_enqueue runs with its owner's rights, so that a producer role needs only
-- USAGE on the schema and EXECUTE on the function: it enqueues with the function's
-- validation, limits and sequencing, and cannot write outbox_events or the
-- per-aggregate counters itself (docs/security.md, "function-only producers").
--
-- A SECURITY DEFINER function needs a fixed search_path: pg_catalog first and
-- pg_temp last, so that neither the caller's search_path nor its temporary objects
-- can stand in for a built-in; every pgoutbox object in the body is qualified with
-- the schema. EXECUTE is revoked from PUBLIC (every function has it by default), or
-- any role allowed into the schema could enqueue with the owner's rights: grant it
-- to the producers ("pgoutbox migrate print --grants").
--
-- The body is migration 6's, unchanged. CREATE OR REPLACE FUNCTION resets both
-- attributes: a later migration that redefines outbox_enqueue must declare them
-- again (migrate's tests check the final state).
ALTER FUNCTION {{schema}}.outbox_enqueue(text, text, text, jsonb, integer, jsonb)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
REVOKE EXECUTE ON FUNCTION {{schema}}.outbox_enqueue(text, text, text, jsonb, integer, jsonb) FROM PUBLIC;
