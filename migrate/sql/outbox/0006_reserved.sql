-- PLACEHOLDER on branch h-cli only: version 6 belongs to the header-rules
-- migration of branch h-hdr. It exists so that 0007 applies on this branch
-- (versions of a line must be 1..n without holes). Delete this file when merging
-- h-hdr's 0006; two version-6 files make every migrate fail loudly.
SELECT 1 FROM {{schema}}.outbox_events LIMIT 0;
