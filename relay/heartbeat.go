package relay

import (
	"strings"

	"github.com/pgoutbox/pgoutbox/internal/heartbeat"
)

// Heartbeats: every relay keeps a row in its schema's outbox_relays table (outbox
// migration 11), written by package internal/heartbeat, so that "no relay
// running" and "relays idle" look different in status and the console. The hub
// writes the rows of all its relays in one statement every HeartbeatInterval,
// so the cost grows with the databases served, not with their tenants; a relay
// writes its last row, state 'stopped', when it stops.

// heartbeat is the row r writes now.
func (r *Relay) heartbeat() heartbeat.Beat {
	state := heartbeat.Busy
	if r.allIdle() {
		state = heartbeat.Idle
	}
	return heartbeat.Beat{Table: r.q.relays, ID: r.cfg.ID, State: state, Started: r.started, Every: r.cfg.HeartbeatInterval}
}

// beats writes the heartbeats of the hub's relays at once, then every
// interval and whenever a relay joins, until the hub stops.
func (h *hub) beats() {
	ctx, cancel := h.helperContext()
	defer cancel()
	k := heartbeat.Keeper{
		Pool: h.pool, Bounds: h.bounds, Source: heartbeat.SourcePoll, Every: h.heartbeatInterval, Log: h.log,
		Beats: func() []heartbeat.Beat {
			var beats []heartbeat.Beat
			for _, r := range h.snapshot() {
				beats = append(beats, r.heartbeat())
			}
			return beats
		},
		Wake: h.joined,
	}
	k.Keep(ctx)
}

// beatStopped writes r's last heartbeat, state 'stopped'; best effort.
func (r *Relay) beatStopped() {
	k := heartbeat.Keeper{Pool: r.pool, Bounds: r.bounds, Source: heartbeat.SourcePoll, Log: r.log}
	k.WriteStopped(stopReleaseTimeout, r.heartbeat())
}

// truncate cuts s to at most n bytes, at a character boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}
