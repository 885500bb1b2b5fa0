// Package heartbeat writes the heartbeats of pgoutbox's relays, polling and
// CDC alike, in a schema's outbox_relays table (outbox migration 11), so that
// "no relay running" and "relays idle" look different in status and the
// console. It is the one writer: the polling relay's hub (the rows of all its
// relays in one statement) and the CDC source (its one row) both Keep their
// beats through it, and write a last one, state Stopped, when they stop. A
// failed heartbeat is logged and changes nothing else: the relay's own
// statements report the database's health.
package heartbeat

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

// Heartbeat states, as outbox_relays.state holds them.
const (
	Busy    = "busy"    // the relay claims, publishes or settles
	Idle    = "idle"    // the relay waits for work
	Stopped = "stopped" // the relay stopped cleanly
)

// Sources, as outbox_relays.source holds them.
const (
	SourcePoll = "poll" // the polling relay (package relay)
	SourceCDC  = "cdc"  // the logical-replication source (package cdc)
)

// DefaultInterval is how often a relay records that it is alive unless
// configured otherwise; MaxInterval is the longest allowed, so that a live
// relay does not look gone for long.
const (
	DefaultInterval = 15 * time.Second
	MaxInterval     = time.Hour
)

// perStatement bounds one heartbeat statement (4 parameters a relay).
const perStatement = 1000

// Beat is one relay's heartbeat row.
type Beat struct {
	Table   string // the quoted outbox_relays table
	ID      string
	State   string
	Started time.Time
	Every   time.Duration // the relay's heartbeat interval
}

// Host is this machine's name as a heartbeat shows it.
var Host = sync.OnceValue(func() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "unknown"
	}
	return truncate(h, 255)
})

// Version is pgoutbox's version in this binary: the module version of the
// library as the binary was built with it, with the VCS revision when the
// build recorded one.
var Version = sync.OnceValue(func() string {
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

// SQL is one statement writing beats of relays of source, with its
// arguments: one data-modifying WITH query per relay, the shared values first.
func SQL(source string, beats []Beat) (string, []any) {
	args := []any{source, Version(), Host(), int32(os.Getpid())}
	var b strings.Builder
	b.WriteString("WITH ")
	for i, bt := range beats {
		if i > 0 {
			b.WriteString(", ")
		}
		n := len(args)
		args = append(args, bt.ID, bt.State, bt.Started, bt.Every.Milliseconds())
		fmt.Fprintf(&b, `b%d AS (INSERT INTO %s (relay_id, source, version, host, pid, state, beat_every, started_at, last_seen)
    VALUES ($%d::text, $1::text, $2::text, $3::text, $4::integer, $%d::text, $%d::bigint * interval '1 millisecond', $%d::timestamptz, now())
    ON CONFLICT (relay_id) DO UPDATE SET source = excluded.source, version = excluded.version, host = excluded.host,
        pid = excluded.pid, state = excluded.state, beat_every = excluded.beat_every, started_at = excluded.started_at,
        last_seen = excluded.last_seen)`,
			i, bt.Table, n+1, n+2, n+4, n+3)
	}
	b.WriteString(" SELECT 1")
	return b.String(), args
}

// Write writes beats of relays of source, in statements of at most 1000
// beats, each under bounds.
func Write(ctx context.Context, db *pgxpool.Pool, bounds pgbound.Bounds, source string, beats []Beat) error {
	for len(beats) > 0 {
		n := min(len(beats), perStatement)
		q, args := SQL(source, beats[:n])
		b := &pgx.Batch{}
		b.Queue(q, args...)
		if err := pgbound.Send(ctx, db, bounds, b, nil); err != nil {
			return fmt.Errorf("heartbeat: %w", err)
		}
		beats = beats[n:]
	}
	return nil
}

// Keeper writes a relay's (or a hub's relays') heartbeats: Keep at once,
// then every Every and whenever Wake is poked, until its context ends.
type Keeper struct {
	Pool   *pgxpool.Pool
	Bounds pgbound.Bounds
	Source string // SourcePoll or SourceCDC
	Every  time.Duration
	Log    *slog.Logger
	// Beats returns the rows to write now; none writes nothing.
	Beats func() []Beat
	// Wake, if not nil, asks for a heartbeat now (a relay joined).
	Wake <-chan struct{}
}

// Keep writes the heartbeats until ctx ends. A failure is logged once (WARN)
// until a heartbeat succeeds again (INFO).
func (k *Keeper) Keep(ctx context.Context) {
	t := time.NewTicker(k.Every)
	defer t.Stop()
	failing := false
	for {
		if beats := k.Beats(); len(beats) > 0 {
			wctx, wcancel := context.WithTimeout(ctx, max(k.Every, k.Bounds.Deadline()))
			err := Write(wctx, k.Pool, k.Bounds, k.Source, beats)
			wcancel()
			switch {
			case err != nil && ctx.Err() == nil && !failing:
				k.Log.Warn("could not record the relays' heartbeat; status and the console may show them as gone", slog.Any("error", err))
				failing = true
			case err == nil && failing:
				k.Log.Info("recording the relays' heartbeat again")
				failing = false
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-k.Wake:
		}
	}
}

// WriteStopped writes b's last heartbeat, state Stopped, within timeout; best
// effort: a failure is logged at DEBUG.
func (k *Keeper) WriteStopped(timeout time.Duration, b Beat) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	b.State = Stopped
	if err := Write(ctx, k.Pool, k.Bounds, k.Source, []Beat{b}); err != nil {
		k.Log.Debug("could not record that the relay stopped", slog.Any("error", err))
	}
}
