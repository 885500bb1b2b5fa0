-- compat: expand: a trigger that only wakes relays; older binaries poll as before.
-- Wake relays within milliseconds of a commit: every INSERT statement into the outbox
-- sends one notification on the schema's channel, delivered at commit (and only if the
-- transaction commits). Identical notifications of one transaction fold into one.
--
-- The channel is 'pgoutbox.' || schema, or 'pgoutbox.' || md5(schema) when that would
-- exceed PostgreSQL's 63-byte limit; relays compute the same name.
--
-- Producers that do not want to pay for NOTIFY (it serialises committing transactions
-- briefly) can SET pgoutbox.notify = 'off' (per session, role or database); relays then
-- find their events by polling.
CREATE OR REPLACE FUNCTION {{schema}}.outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    v_channel text := 'pgoutbox.' || TG_TABLE_SCHEMA;
BEGIN
    IF coalesce(current_setting('pgoutbox.notify', true), '') = 'off' THEN
        RETURN NULL;
    END IF;
    IF octet_length(v_channel) > 63 THEN
        v_channel := 'pgoutbox.' || md5(TG_TABLE_SCHEMA);
    END IF;
    PERFORM pg_notify(v_channel, '');
    RETURN NULL;
END
$fn$;

DROP TRIGGER IF EXISTS outbox_events_notify ON {{schema}}.outbox_events;
CREATE TRIGGER outbox_events_notify
    AFTER INSERT ON {{schema}}.outbox_events
    FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.outbox_notify();
