-- compat: expand: the table accepts rows it refused before, which every relay and CDC source in the window quarantines or consumers refuse; no binary relies on the constraints.
-- outbox_events drops five of its six CHECK constraints: the empty aggregate
-- type, aggregate id and event type, a schema version below 1 and headers that
-- are not a JSON object. PostgreSQL rebuilds every CHECK expression from its
-- stored form at each INSERT statement, and these five cost the producer's
-- statement about 15 µs of server CPU per transaction with 16 producers (of about
-- 200; docs/performance.md, "What each kept cost buys"), while repeating what is
-- already checked where it matters:
--
--   * the Go API (Producer.Validate) and outbox_enqueue refuse all five before any
--     row is written, with a typed error or SQLSTATE 22023;
--   * a row written around both, by a raw INSERT, is refused before publishing by
--     the relay and the CDC source (broker.CheckMessage: empty names since outbox
--     migration 9's release, a schema version below 1 from this one; headers that
--     are not a JSON object of strings, pipeline.DecodeHeaders) and quarantined
--     with the reason in last_error, as the other rules a raw INSERT can break
--     already were. A relay of an older release in the window publishes a
--     schema version below 1 as written, and every pgoutbox subscriber refuses it
--     (wire.ParseReceived): an error, never a silent drop.
--
-- outbox_events_aggregate_sequence_check (aggregate_sequence >= 1) stays: a lane's
-- cursor starts at 0, so a row below 1 would count as delivered to every
-- destination without being published.
--
-- Each DROP takes an ACCESS EXCLUSIVE lock on outbox_events for a catalog change
-- only (no scan, no rewrite); migrate runs in one transaction.
ALTER TABLE {{schema}}.outbox_events
    DROP CONSTRAINT IF EXISTS outbox_events_aggregate_type_check,
    DROP CONSTRAINT IF EXISTS outbox_events_aggregate_id_check,
    DROP CONSTRAINT IF EXISTS outbox_events_event_type_check,
    DROP CONSTRAINT IF EXISTS outbox_events_schema_version_check,
    DROP CONSTRAINT IF EXISTS outbox_events_headers_check;
