-- compat: expand: outbox_enqueue refuses what the Go API of the same binaries already refuses.
-- outbox_enqueue as in migration 4, now refusing what cannot be published: the
-- same limits and header rules as the Go API (package pgoutbox: limits.go), so an
-- event either fails here, in the caller's statement, or can be published.
--
--   * aggregate_type and event_type at most 100 bytes, aggregate_id at most 255
--     (SQLSTATE 54000): a longer key may not fit the btree of the
--     (aggregate_type, aggregate_id, aggregate_sequence) index, and would not fit
--     a broker's subject, topic or routing key.
--   * headers: at most 64, at most 16384 bytes of names and values (54000); names
--     RFC 9110 tokens of at most 128 bytes, distinct without case, not reserved
--     (Outbox-*, Nats-*, Content-*, x-*, CC, BCC, HTTP credentials, transport and
--     hop-by-hop headers, Idempotency-Key); values without control characters or
--     leading and trailing spaces (22023).
--   * payload: at most pgoutbox.max_payload_bytes bytes of its jsonb text (54000).
--     Unset, the limit is 1015808 (1 MiB less 32 KiB). A session may choose any
--     limit from 1 to 67108864 (64 MiB, the hard maximum): anything else (0, a
--     negative or larger number, text) is refused with 22023 rather than taken as
--     "no limit".
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
    v_setting  text := nullif(btrim(current_setting('pgoutbox.max_payload_bytes', true)), '');
    v_limit    bigint := 1015808;
    v_size     bigint;
    v_count    bigint;
    v_total    bigint;
    v_name     text;
    v_sequence bigint;
    v_bytes    bytea;
    v_id       uuid;
BEGIN
    IF v_setting IS NOT NULL THEN
        IF v_setting !~ '^[0-9]{1,9}$' OR v_setting::bigint < 1 OR v_setting::bigint > 67108864 THEN
            RAISE EXCEPTION 'outbox_enqueue: pgoutbox.max_payload_bytes is %, want a number of bytes from 1 to 67108864', quote_literal(v_setting)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_limit := v_setting::bigint;
    END IF;

    IF outbox_enqueue.aggregate_type IS NULL OR outbox_enqueue.aggregate_type = '' THEN
        RAISE EXCEPTION 'outbox_enqueue: aggregate_type must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF outbox_enqueue.aggregate_id IS NULL OR outbox_enqueue.aggregate_id = '' THEN
        RAISE EXCEPTION 'outbox_enqueue: aggregate_id must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF outbox_enqueue.event_type IS NULL OR outbox_enqueue.event_type = '' THEN
        RAISE EXCEPTION 'outbox_enqueue: event_type must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(outbox_enqueue.aggregate_type) > 100 THEN
        RAISE EXCEPTION 'outbox_enqueue: aggregate_type is % bytes, above the limit of 100 bytes', octet_length(outbox_enqueue.aggregate_type)
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF octet_length(outbox_enqueue.aggregate_id) > 255 THEN
        RAISE EXCEPTION 'outbox_enqueue: aggregate_id is % bytes, above the limit of 255 bytes', octet_length(outbox_enqueue.aggregate_id)
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF octet_length(outbox_enqueue.event_type) > 100 THEN
        RAISE EXCEPTION 'outbox_enqueue: event_type is % bytes, above the limit of 100 bytes', octet_length(outbox_enqueue.event_type)
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF outbox_enqueue.payload IS NULL THEN
        RAISE EXCEPTION 'outbox_enqueue: payload must not be NULL (use ''null''::jsonb for a JSON null)' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The jsonb text form is what the relay reads and publishes.
    v_size := octet_length(outbox_enqueue.payload::text);
    IF v_size > v_limit THEN
        RAISE EXCEPTION 'outbox_enqueue: payload is % bytes as stored (jsonb text), above the limit of % bytes (pgoutbox.max_payload_bytes)', v_size, v_limit
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
    SELECT count(*), coalesce(sum(octet_length(h.key) + octet_length(h.value)), 0)
      INTO v_count, v_total
      FROM jsonb_each_text(outbox_enqueue.headers) AS h;
    IF v_count > 64 THEN
        RAISE EXCEPTION 'outbox_enqueue: % headers, above the limit of 64', v_count USING ERRCODE = 'program_limit_exceeded';
    END IF;
    -- Names: RFC 9110 tokens (NATS refuses ':' and spaces, HTTP control characters).
    SELECT h.key INTO v_name FROM jsonb_each_text(outbox_enqueue.headers) AS h
     WHERE octet_length(h.key) > 128 OR h.key !~ '^[-!#$%&''*+.^_`|~0-9A-Za-z]+$'
     ORDER BY h.key LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'outbox_enqueue: header name % is not a token of at most 128 bytes (letters, digits and !#$%%&''*+-.^_`|~ only)', quote_literal(left(v_name, 40))
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (SELECT count(DISTINCT lower(h.key)) FROM jsonb_each_text(outbox_enqueue.headers) AS h) < v_count THEN
        RAISE EXCEPTION 'outbox_enqueue: header names must differ in more than case' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Reserved: names a broker or HTTP acts on (pgoutbox.ReservedHeader).
    SELECT h.key INTO v_name FROM jsonb_each_text(outbox_enqueue.headers) AS h
     WHERE lower(h.key) LIKE 'outbox-%' OR lower(h.key) LIKE 'nats-%'
        OR lower(h.key) LIKE 'content-%' OR lower(h.key) LIKE 'x-%'
        OR lower(h.key) IN ('authorization', 'proxy-authorization', 'proxy-authenticate', 'www-authenticate',
                            'cookie', 'set-cookie', 'host', 'transfer-encoding', 'te', 'trailer', 'connection',
                            'keep-alive', 'proxy-connection', 'upgrade', 'expect', 'idempotency-key', 'cc', 'bcc')
     ORDER BY h.key LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'outbox_enqueue: header name % is reserved (broker or transport control, see pgoutbox.ReservedHeader)', quote_literal(v_name)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Values: NATS and HTTP end a header at CR or LF and trim spaces around it.
    SELECT h.key INTO v_name FROM jsonb_each_text(outbox_enqueue.headers) AS h
     WHERE h.value ~ ('[' || chr(1) || '-' || chr(31) || chr(127) || ']')
        OR h.value LIKE ' %' OR h.value LIKE '% '
     ORDER BY h.key LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'outbox_enqueue: the value of header % has a control character or a leading or trailing space', quote_literal(v_name)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_total > 16384 THEN
        RAISE EXCEPTION 'outbox_enqueue: header names and values are % bytes, above the limit of 16384', v_total
            USING ERRCODE = 'program_limit_exceeded';
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
