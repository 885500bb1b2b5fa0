package cdc

import (
	"context"

	"github.com/pgoutbox/pgoutbox/internal/heartbeat"
	"github.com/pgoutbox/pgoutbox/internal/pgbound"
)

// Heartbeat: the source keeps a row in its schema's outbox_relays table, as
// the polling relay does and through the same writer (package
// internal/heartbeat): relay id "cdc:<slot>" (Config.Owner), source cdc,
// busy while it holds events not settled or lanes on the table path, else
// idle; state stopped when it stops. A failed heartbeat is logged and changes
// nothing else.

// heartbeat is the row s writes now.
func (s *Source) heartbeat() heartbeat.Beat {
	s.mu.Lock()
	busy := s.buffered > 0 || len(s.blocked) > 0
	s.mu.Unlock()
	state := heartbeat.Idle
	if busy || s.inFlight.Load() > 0 {
		state = heartbeat.Busy
	}
	return heartbeat.Beat{Table: s.q.relays, ID: s.cfg.Owner(), State: state, Started: s.started, Every: s.cfg.HeartbeatInterval}
}

// keeper is the source's heartbeat writer.
func (s *Source) keeper() heartbeat.Keeper {
	return heartbeat.Keeper{
		Pool: s.pool, Bounds: pgbound.New(StatementTimeout, HeartbeatLockTimeout), Source: heartbeat.SourceCDC,
		Every: s.cfg.HeartbeatInterval, Log: s.log,
		Beats: func() []heartbeat.Beat { return []heartbeat.Beat{s.heartbeat()} },
	}
}

// beats writes the heartbeat at once, then every HeartbeatInterval, until the
// source stops.
func (s *Source) beats() {
	ctx, cancel := context.WithCancel(s.hardCtx)
	defer cancel()
	go func() {
		select {
		case <-s.stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	k := s.keeper()
	k.Keep(ctx)
}

// beatStopped writes the last heartbeat, state stopped; best effort.
func (s *Source) beatStopped() {
	k := s.keeper()
	k.WriteStopped(StatementTimeout, s.heartbeat())
}
