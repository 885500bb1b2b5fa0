-- compat: contract: binaries that do not know it would retry, skip and replay without the audit row.
-- The audit trail of operator actions: pgoutbox dlq retry, dlq skip and replay
-- (admin.Admin.RetryEvents, Skip, admin.Replay). Each action writes one row in the
-- same transaction that does it (replay: before it publishes anything, updated
-- with the outcome when it ends), saying who (the operator's name as given with
-- --actor, $PGOUTBOX_ACTOR or user@host, and the database role), when, why and
-- what (the selection and the events). Rows are never deleted by pgoutbox.
CREATE TABLE IF NOT EXISTS {{schema}}.outbox_operator_audit (
    audit_id    bigint      GENERATED ALWAYS AS IDENTITY,
    -- dlq_retry, dlq_skip or replay.
    action      text        NOT NULL,
    actor       text        NOT NULL,
    db_user     text        NOT NULL DEFAULT current_user,
    reason      text        NOT NULL,
    -- How the events were chosen: ids, a filter, all; for a replay its run id and
    -- destination.
    selection   jsonb       NOT NULL DEFAULT '{}',
    -- The events acted on (retry, skip, a replay by ids), and how many (a replay:
    -- selected, then published in outcome).
    event_ids   uuid[]      NOT NULL DEFAULT '{}',
    event_count bigint      NOT NULL,
    outcome     jsonb,
    at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT outbox_operator_audit_pkey PRIMARY KEY (audit_id),
    CONSTRAINT outbox_operator_audit_action_check CHECK (action IN ('dlq_retry', 'dlq_skip', 'replay')),
    CONSTRAINT outbox_operator_audit_actor_check CHECK (btrim(actor) <> ''),
    CONSTRAINT outbox_operator_audit_reason_check CHECK (btrim(reason) <> '')
);

CREATE INDEX IF NOT EXISTS outbox_operator_audit_at
    ON {{schema}}.outbox_operator_audit (at);
