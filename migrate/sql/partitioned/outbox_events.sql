-- The time-partitioned outbox (migrate --partitioned). Applied just before
-- outbox/0001, whose CREATE TABLE IF NOT EXISTS then finds this table and whose
-- partial index becomes a partitioned index. The columns are 0001's; only the keys
-- differ, because every unique key of a partitioned table must hold the partition
-- key (occurred_at):
--
--   * the primary key is (event_id, occurred_at): event ids are unique per
--     partition, not across partitions (UUIDv7 ids never collide; an Event.ID
--     chosen by the producer is only caught twice within one day);
--   * UNIQUE (aggregate_type, aggregate_id, aggregate_sequence) is an index of each
--     partition, so it holds per partition only. Sequences stay gap-free and unique
--     because they come from the counter row lock (outbox_aggregate_sequences),
--     never from this index.
--
-- Partitions are daily, in UTC, named outbox_events_pYYYYMMDD, created ahead of
-- time by outbox_create_partitions (called by migrate, cleanup and the relay's
-- cleanup job, or by pg_cron). A row outside every partition goes to
-- outbox_events_default, so an insert never fails for want of a partition.
CREATE TABLE IF NOT EXISTS {{schema}}.outbox_events (
    event_id           uuid        NOT NULL,
    aggregate_type     text        NOT NULL,
    aggregate_id       text        NOT NULL,
    aggregate_sequence bigint      NOT NULL,
    event_type         text        NOT NULL,
    schema_version     integer     NOT NULL DEFAULT 1,
    payload            jsonb       NOT NULL,
    headers            jsonb       NOT NULL DEFAULT '{}'::jsonb,
    occurred_at        timestamptz NOT NULL DEFAULT now(),
    available_at       timestamptz NOT NULL DEFAULT now(),
    claimed_by         text,
    claim_until        timestamptz,
    published_at       timestamptz,
    attempt_count      integer     NOT NULL DEFAULT 0,
    last_error         text,
    quarantined_at     timestamptz,
    CONSTRAINT outbox_events_pkey PRIMARY KEY (event_id, occurred_at),
    CONSTRAINT outbox_events_aggregate_type_check CHECK (aggregate_type <> ''),
    CONSTRAINT outbox_events_aggregate_id_check CHECK (aggregate_id <> ''),
    CONSTRAINT outbox_events_event_type_check CHECK (event_type <> ''),
    CONSTRAINT outbox_events_aggregate_sequence_check CHECK (aggregate_sequence >= 1),
    CONSTRAINT outbox_events_schema_version_check CHECK (schema_version >= 1),
    CONSTRAINT outbox_events_headers_check CHECK (jsonb_typeof(headers) = 'object')
) PARTITION BY RANGE (occurred_at);

CREATE TABLE IF NOT EXISTS {{schema}}.outbox_events_default
    PARTITION OF {{schema}}.outbox_events DEFAULT WITH (fillfactor = 70);
CREATE UNIQUE INDEX IF NOT EXISTS outbox_events_default_aggregate_sequence_key
    ON {{schema}}.outbox_events_default (aggregate_type, aggregate_id, aggregate_sequence);

-- outbox_create_partitions makes sure the daily partitions from today (UTC) to
-- days_ahead days later exist, and returns the names of those it created. A day
-- whose rows already sit in the default partition is left alone (creating its
-- partition would fail); those rows are cleaned up by batched deletes. Creating a
-- partition locks the parent table briefly: callers may SET LOCAL lock_timeout.
CREATE OR REPLACE FUNCTION {{schema}}.outbox_create_partitions(days_ahead integer DEFAULT 7)
RETURNS SETOF text
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
    v_schema text := {{schema_name}}; -- a value: quoted with format('%I') below
    v_day    date := (now() AT TIME ZONE 'UTC')::date;
    v_last   date;
    v_name   text;
    v_from   timestamptz;
    v_to     timestamptz;
    v_taken  boolean;
BEGIN
    IF days_ahead IS NULL OR days_ahead < 0 THEN
        RAISE EXCEPTION 'outbox_create_partitions: days_ahead must be at least 0' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_last := v_day + days_ahead;
    WHILE v_day <= v_last LOOP
        v_name := 'outbox_events_p' || to_char(v_day, 'YYYYMMDD');
        v_from := v_day::timestamp AT TIME ZONE 'UTC';
        v_to := (v_day + 1)::timestamp AT TIME ZONE 'UTC';
        IF to_regclass(format('%I.%I', v_schema, v_name)) IS NULL THEN
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I.outbox_events_default WHERE occurred_at >= $1 AND occurred_at < $2)', v_schema)
                INTO v_taken USING v_from, v_to;
            IF NOT v_taken THEN
                EXECUTE format('CREATE TABLE IF NOT EXISTS %I.%I PARTITION OF %I.outbox_events FOR VALUES FROM (%L) TO (%L) WITH (fillfactor = 70)',
                               v_schema, v_name, v_schema, v_from, v_to);
                EXECUTE format('CREATE UNIQUE INDEX IF NOT EXISTS %I ON %I.%I (aggregate_type, aggregate_id, aggregate_sequence)',
                               v_name || '_aggregate_sequence_key', v_schema, v_name);
                RETURN NEXT v_name;
            END IF;
        END IF;
        v_day := v_day + 1;
    END LOOP;
END
$fn$;
