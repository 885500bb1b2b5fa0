-- compat: expand: new tables and a wider audit check; older binaries neither read nor write the tables, and the actions they audit stay allowed.
-- Destinations: one event, several named places (docs/design.md, "Destinations").
-- A relay started with destinations (relay.Config.Destinations, pgoutbox relay
-- --destinations-file) registers each one here and keeps, per destination and
-- per aggregate lane, how far that destination has got. The producer's
-- transaction is untouched: no row per destination is written at enqueue.
--
-- outbox_events.published_at keeps its meaning for cleanup, the oldest-pending
-- figures and the single-broker relay: the event is done. With destinations it
-- is set when every destination the relay serves has passed the event (delivered
-- it, or it was not routed there).

-- One row per destination ever registered. rules is the routing as the relay
-- last configured it (shown by status, audited when it changes); start is how
-- the destination began: 'now' (events committed after its registration) or
-- 'backfill' (every retained event, in order per aggregate). dropped by an
-- operator only (pgoutbox destinations drop), which deletes its progress too.
CREATE TABLE IF NOT EXISTS {{schema}}.outbox_destinations (
    name          text        NOT NULL,
    rules         jsonb       NOT NULL,
    start         text        NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now(),
    -- When a relay last registered it (its rules may have changed then).
    updated_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT outbox_destinations_pkey PRIMARY KEY (name),
    CONSTRAINT outbox_destinations_name_check CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    CONSTRAINT outbox_destinations_start_check CHECK (start IN ('now', 'backfill')),
    CONSTRAINT outbox_destinations_rules_check CHECK (jsonb_typeof(rules) = 'array' AND octet_length(rules::text) <= 65536)
);

-- A destination's progress on one aggregate lane. Every event of the lane up to
-- delivered_sequence is delivered to the destination or was not routed to it; the
-- next one is the lowest retained sequence above it (sequences are gapless in
-- commit order, so a visible higher one means every lower one is committed). A
-- lane without a row starts at 0. The columns after it are the lane's lease,
-- backoff and quarantine for this destination alone, as outbox_events has them
-- for the single-broker relay: a destination's failure holds back only its own
-- lanes. quarantined_sequence is the event a dead letter stopped at.
CREATE TABLE IF NOT EXISTS {{schema}}.outbox_destination_lanes (
    destination          text        NOT NULL,
    aggregate_type       text        NOT NULL,
    aggregate_id         text        NOT NULL,
    delivered_sequence   bigint      NOT NULL DEFAULT 0,
    attempt_count        integer     NOT NULL DEFAULT 0,
    available_at         timestamptz NOT NULL DEFAULT now(),
    claimed_by           text,
    claim_until          timestamptz,
    last_error           text,
    quarantined_at       timestamptz,
    quarantined_sequence bigint,
    CONSTRAINT outbox_destination_lanes_pkey PRIMARY KEY (destination, aggregate_type, aggregate_id),
    CONSTRAINT outbox_destination_lanes_delivered_check CHECK (delivered_sequence >= 0)
);

-- The dead letters of a destination, for dlq list and the console.
CREATE INDEX IF NOT EXISTS outbox_destination_lanes_quarantined_idx
    ON {{schema}}.outbox_destination_lanes (destination, quarantined_at)
    WHERE quarantined_at IS NOT NULL;

-- The operator actions on destinations are audited like the others.
ALTER TABLE {{schema}}.outbox_operator_audit
    DROP CONSTRAINT IF EXISTS outbox_operator_audit_action_check;
ALTER TABLE {{schema}}.outbox_operator_audit
    ADD CONSTRAINT outbox_operator_audit_action_check
    CHECK (action IN ('dlq_retry', 'dlq_skip', 'replay', 'destination_drop', 'destination_rules'));
