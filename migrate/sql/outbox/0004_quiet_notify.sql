-- compat: contract: relays that do not say they wait would no longer be woken and fall back to polling.
-- Notify only when a relay waits for work.
--
-- NOTIFY is not free: a committing transaction that queued a notification takes a
-- database-wide lock until its commit is durable, so notifying producers commit one
-- at a time and lose group commit. A busy relay does not need to be told: it claims
-- again as soon as its batch is settled. So relays announce when they wait, and
-- producers notify only then.
--
-- The announcement is an advisory lock, not a row, so that no snapshot can hide it
-- (a REPEATABLE READ producer would not see a row committed after its snapshot):
--
--   * an idle relay holds the session-level advisory lock
--     (hashtext('pgoutbox.idle'), hashtext(<schema>)) in exclusive mode;
--   * a producer calls outbox_wake() in the statement that enqueues (the Go API and
--     outbox_enqueue do). It tries to take the same lock in shared mode, until its
--     transaction ends. If it cannot, a relay is idle (or about to be): it notifies,
--     and the notification is delivered at commit. If it can, no relay is idle, and a
--     relay that wants to go idle must wait for this transaction to end before it
--     holds the lock; the relay then claims once more and finds the event.
--
-- No commit goes unseen either way. Rows inserted into outbox_events by other means
-- do not notify: relays find them by polling (relay --poll-interval), as they do for
-- producers that SET pgoutbox.notify = 'off'.
--
-- This replaces migration 2's per-statement trigger, which notified on every commit.
DROP TRIGGER IF EXISTS outbox_events_notify ON {{schema}}.outbox_events;
DROP FUNCTION IF EXISTS {{schema}}.outbox_notify();

CREATE OR REPLACE FUNCTION {{schema}}.outbox_wake() RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    v_channel text := 'pgoutbox.' || {{schema_name}};
BEGIN
    IF coalesce(current_setting('pgoutbox.notify', true), '') = 'off' THEN
        RETURN false;
    END IF;
    IF pg_try_advisory_xact_lock_shared(hashtext('pgoutbox.idle'), hashtext({{schema_name}})) THEN
        RETURN false; -- no relay is idle, and none can go idle before this transaction ends
    END IF;
    IF octet_length(v_channel) > 63 THEN
        v_channel := 'pgoutbox.' || md5({{schema_name}});
    END IF;
    PERFORM pg_notify(v_channel, '');
    RETURN true;
END
$fn$;

-- outbox_enqueue as in migration 1, now waking an idle relay.
CREATE OR REPLACE FUNCTION {{schema}}.outbox_enqueue(
    aggregate_type text,
    aggregate_id   text,
    event_type     text,
    payload        jsonb,
    schema_version integer DEFAULT 1,
    headers        jsonb   DEFAULT '{}'::jsonb
) RETURNS uuid
LANGUAGE plpgsql VOLATILE
AS $fn$
#variable_conflict use_column
DECLARE
    v_limit    bigint := coalesce(nullif(current_setting('pgoutbox.max_payload_bytes', true), '')::bigint, 1048576);
    v_size     bigint;
    v_sequence bigint;
    v_bytes    bytea;
    v_id       uuid;
BEGIN
    IF outbox_enqueue.aggregate_type IS NULL OR outbox_enqueue.aggregate_type = '' THEN
        RAISE EXCEPTION 'outbox_enqueue: aggregate_type must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF outbox_enqueue.aggregate_id IS NULL OR outbox_enqueue.aggregate_id = '' THEN
        RAISE EXCEPTION 'outbox_enqueue: aggregate_id must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF outbox_enqueue.event_type IS NULL OR outbox_enqueue.event_type = '' THEN
        RAISE EXCEPTION 'outbox_enqueue: event_type must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF outbox_enqueue.payload IS NULL THEN
        RAISE EXCEPTION 'outbox_enqueue: payload must not be NULL (use ''null''::jsonb for a JSON null)' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_size := octet_length(outbox_enqueue.payload::text);
    IF v_limit > 0 AND v_size > v_limit THEN
        RAISE EXCEPTION 'outbox_enqueue: payload is % bytes, above the limit of % bytes (pgoutbox.max_payload_bytes)', v_size, v_limit
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF outbox_enqueue.schema_version IS NULL OR outbox_enqueue.schema_version < 1 THEN
        RAISE EXCEPTION 'outbox_enqueue: schema_version must be at least 1, got %', coalesce(outbox_enqueue.schema_version::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF outbox_enqueue.headers IS NULL OR jsonb_typeof(outbox_enqueue.headers) <> 'object' THEN
        RAISE EXCEPTION 'outbox_enqueue: headers must be a JSON object' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_each(outbox_enqueue.headers) AS h WHERE h.key = '' OR jsonb_typeof(h.value) <> 'string') THEN
        RAISE EXCEPTION 'outbox_enqueue: headers must map non-empty names to string values' USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- Takes the aggregate's counter row lock until the transaction ends: see the table's comment.
    INSERT INTO {{schema}}.outbox_aggregate_sequences AS s (aggregate_type, aggregate_id, last_sequence)
    VALUES (outbox_enqueue.aggregate_type, outbox_enqueue.aggregate_id, 1)
    ON CONFLICT (aggregate_type, aggregate_id)
        DO UPDATE SET last_sequence = s.last_sequence + 1
    RETURNING s.last_sequence INTO v_sequence;

    -- UUIDv7: 48-bit Unix milliseconds, version 7, the rest random (variant bits come
    -- from gen_random_uuid already).
    v_bytes := uuid_send(gen_random_uuid());
    v_bytes := overlay(v_bytes PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3) FROM 1 FOR 6);
    v_bytes := set_byte(v_bytes, 6, (get_byte(v_bytes, 6) & 15) | 112);
    v_id := encode(v_bytes, 'hex')::uuid;

    INSERT INTO {{schema}}.outbox_events AS e
        (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, schema_version, payload, headers)
    VALUES (v_id, outbox_enqueue.aggregate_type, outbox_enqueue.aggregate_id, v_sequence,
            outbox_enqueue.event_type, outbox_enqueue.schema_version, outbox_enqueue.payload, outbox_enqueue.headers);

    PERFORM {{schema}}.outbox_wake();
    RETURN v_id;
END
$fn$;
