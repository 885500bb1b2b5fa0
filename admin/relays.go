package admin

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// RelayHeartbeat is a relay's last heartbeat: the row it keeps in the schema's
// outbox_relays table (outbox migration 11), written at start, every heartbeat
// interval and, with State "stopped", when it stops.
type RelayHeartbeat struct {
	ID      string `json:"id"`      // the relay's id (claimed_by of its leases)
	Source  string `json:"source"`  // "poll" (pgoutbox relay) or "cdc"
	Version string `json:"version"` // pgoutbox's version in the relay's binary
	Host    string `json:"host"`
	PID     int    `json:"pid"`
	// State is what the relay last said: "busy" (some worker at work), "idle"
	// (every worker waiting for a wake-up) or "stopped" (it stopped cleanly).
	State    string    `json:"state"`
	Started  time.Time `json:"started"`
	LastSeen time.Time `json:"last_seen"`
	// Age is the time since LastSeen, by the database's clock.
	Age Duration `json:"age_seconds"`
	// Every is the relay's heartbeat interval.
	Every Duration `json:"heartbeat_interval_seconds"`
	// Gone reports a relay that did not stop cleanly and has been silent for
	// three heartbeat intervals: it crashed, hangs or cannot reach the database.
	Gone bool `json:"gone"`
}

// Running reports whether the relay is alive: neither stopped nor gone.
func (h RelayHeartbeat) Running() bool { return h.State != "stopped" && !h.Gone }

// Relays lists the relays' heartbeats, running ones first, then by the time
// they were last seen, newest first.
func (a *Admin) Relays(ctx context.Context) ([]RelayHeartbeat, error) {
	rows, err := a.db.Query(ctx, a.relaysSQL())
	if err != nil {
		return nil, fmt.Errorf("admin: relays: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[RelayHeartbeat])
	if err != nil {
		return nil, fmt.Errorf("admin: relays: %w", err)
	}
	return out, nil
}

// relaysSQL is Relays' query: at most 1000 heartbeats.
func (a *Admin) relaysSQL() string {
	return `
SELECT relay_id, source, version, host, pid, state, started_at, last_seen,
       (extract(epoch FROM greatest(now() - last_seen, interval '0')) * 1e9)::bigint,
       (extract(epoch FROM beat_every) * 1e9)::bigint,
       state <> 'stopped' AND last_seen < now() - 3 * beat_every AS gone
  FROM ` + pgx.Identifier{a.schema, "outbox_relays"}.Sanitize() + `
 ORDER BY (state = 'stopped' OR last_seen < now() - 3 * beat_every), last_seen DESC, relay_id
 LIMIT 1000`
}
