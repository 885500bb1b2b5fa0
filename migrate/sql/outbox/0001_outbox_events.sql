-- compat: contract: the outbox itself; nothing runs without it.
-- The outbox: one immutable row per event, written in the producer's transaction.
--
-- fillfactor 70 leaves room on each page so the relay's claim UPDATE (which touches
-- only unindexed columns) can be a HOT update: no new index entries, less WAL.
CREATE TABLE IF NOT EXISTS {{schema}}.outbox_events (
    event_id           uuid        NOT NULL,
    aggregate_type     text        NOT NULL,
    aggregate_id       text        NOT NULL,
    aggregate_sequence bigint      NOT NULL,
    event_type         text        NOT NULL,
    schema_version     integer     NOT NULL DEFAULT 1,
    payload            jsonb       NOT NULL,
    -- Wire headers chosen by the producer plus the W3C trace context (traceparent,
    -- tracestate) captured at enqueue time: a JSON object of string values.
    headers            jsonb       NOT NULL DEFAULT '{}'::jsonb,
    occurred_at        timestamptz NOT NULL DEFAULT now(),
    -- Not before this instant: the relay's backoff moves it forward.
    available_at       timestamptz NOT NULL DEFAULT now(),
    -- The lease: which relay holds the row and until when.
    claimed_by         text,
    claim_until        timestamptz,
    published_at       timestamptz,
    attempt_count      integer     NOT NULL DEFAULT 0,
    last_error         text,
    -- Set when the event is poison: it stays unpublished and blocks its aggregate's
    -- later events until an operator retries or skips it.
    quarantined_at     timestamptz,
    CONSTRAINT outbox_events_pkey PRIMARY KEY (event_id),
    CONSTRAINT outbox_events_aggregate_sequence_key
        UNIQUE (aggregate_type, aggregate_id, aggregate_sequence),
    CONSTRAINT outbox_events_aggregate_type_check CHECK (aggregate_type <> ''),
    CONSTRAINT outbox_events_aggregate_id_check CHECK (aggregate_id <> ''),
    CONSTRAINT outbox_events_event_type_check CHECK (event_type <> ''),
    CONSTRAINT outbox_events_aggregate_sequence_check CHECK (aggregate_sequence >= 1),
    CONSTRAINT outbox_events_schema_version_check CHECK (schema_version >= 1),
    CONSTRAINT outbox_events_headers_check CHECK (jsonb_typeof(headers) = 'object')
) WITH (fillfactor = 70);

-- Unpublished rows only, ordered as each aggregate's lane: the relay finds the head of
-- every lane here and checks "is a lower sequence still unpublished?" without touching
-- the (much larger) published history.
CREATE INDEX IF NOT EXISTS outbox_events_unpublished_idx
    ON {{schema}}.outbox_events (aggregate_type, aggregate_id, aggregate_sequence)
    WHERE published_at IS NULL;

-- One counter row per aggregate. The producer's upsert of this row takes a row lock
-- held until its transaction ends, which serialises writers of one aggregate: sequence
-- numbers follow commit order, and a rolled-back transaction leaves no gap. Rows are
-- never deleted (cleanup must not touch them), or sequences would restart at 1.
CREATE TABLE IF NOT EXISTS {{schema}}.outbox_aggregate_sequences (
    aggregate_type text   NOT NULL,
    aggregate_id   text   NOT NULL,
    last_sequence  bigint NOT NULL,
    CONSTRAINT outbox_aggregate_sequences_pkey PRIMARY KEY (aggregate_type, aggregate_id)
);

-- outbox_enqueue lets any client (psql, another language, a trigger) enqueue an event
-- with the same validation and sequencing rules as the Go API. It returns the new
-- event's id, a UUIDv7. The payload size limit is the setting
-- pgoutbox.max_payload_bytes (bytes of the jsonb text form), 1 MiB when unset.
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

    RETURN v_id;
END
$fn$;
