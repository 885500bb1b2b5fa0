-- compat: contract: binaries that do not know it would skip dead letters without the audit row.
-- The audit trail of dead letters an operator skipped (pgoutbox dlq skip, admin.Skip).
--
-- Skipping breaks an aggregate's order on purpose: the skipped event is marked
-- published without ever reaching the broker, so its lane moves on. Every skip is
-- therefore recorded here, with who, when and why, in the same transaction that marks
-- the event. Rows are never deleted by pgoutbox: cleanup may delete the outbox row
-- after the retention, but the audit row stays (no foreign key, on purpose). Replay
-- excludes events that have a row here.
CREATE TABLE IF NOT EXISTS {{schema}}.outbox_skipped_events (
    event_id           uuid        NOT NULL,
    aggregate_type     text        NOT NULL,
    aggregate_id       text        NOT NULL,
    aggregate_sequence bigint      NOT NULL,
    event_type         text        NOT NULL,
    -- The event's failure record at the moment it was skipped.
    last_error         text,
    attempt_count      integer     NOT NULL,
    quarantined_at     timestamptz,
    -- Why, who (the operator's name as given, $PGOUTBOX_ACTOR or user@host) and as
    -- which database role, and when.
    reason             text        NOT NULL,
    skipped_by         text        NOT NULL,
    db_user            text        NOT NULL DEFAULT current_user,
    skipped_at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT outbox_skipped_events_pkey PRIMARY KEY (event_id),
    CONSTRAINT outbox_skipped_events_reason_check CHECK (btrim(reason) <> ''),
    CONSTRAINT outbox_skipped_events_skipped_by_check CHECK (skipped_by <> '')
);

-- "How many events were published in the last minute" (pgoutbox status) must not read
-- the published history. A BRIN index answers it from a few page ranges: rows are
-- appended in time order and marked published soon after, on the page they were
-- written to (fillfactor 70 leaves room), so each range's published_at summary is
-- tight. It costs a few pages per million rows and almost nothing per write, unlike a
-- B-tree that would add an index entry to every mark. Pages written since their range
-- was last summarized (autosummarize asks autovacuum to do it as each range fills)
-- are always read, so the tail is read in full: it is the recent part anyway.
-- Cleanup's scans for published_at ranges can use it too.
CREATE INDEX IF NOT EXISTS outbox_events_published_at_brin
    ON {{schema}}.outbox_events USING brin (published_at)
    WITH (pages_per_range = 16, autosummarize = on);
