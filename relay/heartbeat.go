package relay

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/pgbound"
)

// Heartbeats: every relay keeps a row in its schema's outbox_relays table (outbox
// migration 11), so that "no relay running" and "relays idle" look different in
// status and the console. The hub writes the rows of all its relays in one
// statement every HeartbeatInterval, so the cost grows with the databases served,
// not with their tenants; a relay writes its last row, state 'stopped', when it
// stops. A failed heartbeat is logged and changes nothing else: the relay's own
// statements report the database's health.

// Heartbeat states, as outbox_relays.state holds them.
const (
	beatBusy    = "busy"    // some worker claims, publishes or settles
	beatIdle    = "idle"    // every worker waits for a wake-up
	beatStopped = "stopped" // the relay stopped cleanly
)

// beatsPerStatement bounds one heartbeat statement (4 parameters a relay).
const beatsPerStatement = 1000

// beat is one relay's heartbeat row.
type beat struct {
	table   string // the quoted outbox_relays table
	id      string
	state   string
	started time.Time
	every   time.Duration // the relay's HeartbeatInterval
}

// heartbeat is the row r writes now.
func (r *Relay) heartbeat() beat {
	state := beatBusy
	if r.allIdle() {
		state = beatIdle
	}
	return beat{table: r.q.relays, id: r.cfg.ID, state: state, started: r.started, every: r.cfg.HeartbeatInterval}
}

// host is this machine's name as a heartbeat shows it.
var host = sync.OnceValue(func() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "unknown"
	}
	return truncate(h, 255)
})

// version is pgoutbox's version in this binary: the module version of the
// library as the binary was built with it, with the VCS revision when the
// build recorded one.
var version = sync.OnceValue(func() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	if bi.Main.Path != modulePath {
		for _, d := range bi.Deps {
			if d.Path == modulePath {
				v = d.Version
			}
		}
	}
	if v == "" {
		v = "(devel)"
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += " " + s.Value[:12]
		}
	}
	return truncate(v, 200)
})

const modulePath = "github.com/pgoutbox/pgoutbox"

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}

// heartbeatSQL is one statement writing beats, with its arguments: one
// data-modifying WITH query per relay, the shared values first.
func heartbeatSQL(beats []beat) (string, []any) {
	args := []any{"poll", version(), host(), int32(os.Getpid())}
	var b strings.Builder
	b.WriteString("WITH ")
	for i, bt := range beats {
		if i > 0 {
			b.WriteString(", ")
		}
		n := len(args)
		args = append(args, bt.id, bt.state, bt.started, bt.every.Milliseconds())
		fmt.Fprintf(&b, `b%d AS (INSERT INTO %s (relay_id, source, version, host, pid, state, beat_every, started_at, last_seen)
    VALUES ($%d::text, $1::text, $2::text, $3::text, $4::integer, $%d::text, $%d::bigint * interval '1 millisecond', $%d::timestamptz, now())
    ON CONFLICT (relay_id) DO UPDATE SET source = excluded.source, version = excluded.version, host = excluded.host,
        pid = excluded.pid, state = excluded.state, beat_every = excluded.beat_every, started_at = excluded.started_at,
        last_seen = excluded.last_seen)`,
			i, bt.table, n+1, n+2, n+4, n+3)
	}
	b.WriteString(" SELECT 1")
	return b.String(), args
}

// writeBeats writes beats, in statements of at most beatsPerStatement.
func writeBeats(ctx context.Context, db *pgxpool.Pool, bounds pgbound.Bounds, beats []beat) error {
	for len(beats) > 0 {
		n := min(len(beats), beatsPerStatement)
		q, args := heartbeatSQL(beats[:n])
		b := &pgx.Batch{}
		b.Queue(q, args...)
		if err := pgbound.Send(ctx, db, bounds, b, nil); err != nil {
			return fmt.Errorf("heartbeat: %w", err)
		}
		beats = beats[n:]
	}
	return nil
}

// beats writes the heartbeats of the hub's relays at once, then every
// interval and whenever a relay joins, until the hub stops.
func (h *hub) beats() {
	ctx, cancel := h.helperContext()
	defer cancel()
	t := time.NewTicker(h.heartbeatInterval)
	defer t.Stop()
	failing := false
	for {
		var beats []beat
		for _, r := range h.snapshot() {
			beats = append(beats, r.heartbeat())
		}
		if len(beats) > 0 {
			wctx, wcancel := context.WithTimeout(ctx, max(h.heartbeatInterval, h.bounds.Deadline()))
			err := writeBeats(wctx, h.pool, h.bounds, beats)
			wcancel()
			switch {
			case err != nil && ctx.Err() == nil && !failing:
				h.log.Warn("could not record the relays' heartbeat; status and the console may show them as gone", slog.Any("error", err))
				failing = true
			case err == nil && failing:
				h.log.Info("recording the relays' heartbeat again")
				failing = false
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-h.joined:
		}
	}
}

// beatStopped writes r's last heartbeat, state 'stopped'; best effort.
func (r *Relay) beatStopped() {
	ctx, cancel := context.WithTimeout(context.Background(), stopReleaseTimeout)
	defer cancel()
	b := r.heartbeat()
	b.state = beatStopped
	if err := writeBeats(ctx, r.pool, r.bounds, []beat{b}); err != nil {
		r.log.Debug("could not record that the relay stopped", slog.Any("error", err))
	}
}
