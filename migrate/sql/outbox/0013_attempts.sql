-- compat: expand: a new table; older binaries neither read nor write it, and their fail statement simply records no history.
-- Attempt history: each failed publish attempt of an event, written by the fail
-- statement of the relay (and of the CDC source) in the same statement that
-- records the failure on the event (attempt_count, last_error), so the two never
-- disagree. Bounded per event: that statement keeps the 20 newest rows of each
-- event it fails (the event's last_error and attempt_count stay on the event
-- row). Deleted with the event by cleanup (its batches, in the same statement,
-- and before a partition is dropped). The happy path writes nothing here.
--
-- attempt is the event's attempt_count after this failure (it restarts at 1 after
-- dlq retry); attempt_id orders the rows of an event whatever their attempt
-- number. destination is NULL for the single-broker relay. error is the text
-- stored in last_error: redacted and at most 2,000 bytes (retry.ErrorText).
CREATE TABLE IF NOT EXISTS {{schema}}.outbox_attempts (
    event_id    uuid        NOT NULL,
    attempt_id  bigint      GENERATED ALWAYS AS IDENTITY,
    attempt     integer     NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    relay_id    text        NOT NULL,
    destination text,
    error       text        NOT NULL,
    CONSTRAINT outbox_attempts_pkey PRIMARY KEY (event_id, attempt_id)
);
