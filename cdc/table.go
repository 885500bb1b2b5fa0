package cdc

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pipeline"
)

// tablePath publishes the lanes the stream handed over (a failed event, or
// unpublished events the stream will not send), from the table, in sequence
// order, and hands each lane back once it caught up.
func (s *Source) tablePath() {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-s.stopping:
			return
		case <-s.tableWake:
		case <-t.C:
		}
		next := s.drainDue()
		if s.hardCtx.Err() != nil {
			return
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(max(time.Until(next), minTableWait))
	}
}

// drainDue runs rounds while lanes are due, and returns when to look next.
func (s *Source) drainDue() time.Time {
	for {
		select {
		case <-s.stopping:
			return time.Now().Add(time.Hour)
		default:
		}
		progressed, next := s.round()
		if !progressed || next.After(time.Now()) {
			return next
		}
	}
}

// tableRow is one unpublished event of an owned lane.
type tableRow struct {
	pipeline.Event
	quarantined bool
	notBefore   time.Time
	dbNow       time.Time
}

// round is one pass of the table path over the lanes due now: read each lane's
// first RunLength unpublished events, publish the prefix that may go, record
// the outcome, and hand back lanes that have caught up. It reports whether it
// did anything, and when the next lane comes due.
func (s *Source) round() (progressed bool, next time.Time) {
	now := time.Now()
	picked, next := s.pickDue(now)
	if len(picked) == 0 {
		return false, next
	}
	rows, ok := s.readLanes(picked)
	if !ok {
		return false, next
	}
	p, candidates := s.planRound(picked, rows, now)
	send, ok := s.leaseCandidates(candidates, p, now)
	if !ok {
		return false, next
	}
	if len(send) > 0 {
		if !s.publishFromTable(send, p, now) {
			return false, next
		}
		progressed = true
	}
	return s.reschedule(picked, p, now, next, progressed)
}

// roundPlan is what a round found out about the lanes it picked.
type roundPlan struct {
	due   map[pgoutbox.Lane]time.Time // lanes to look at again at a set time
	empty map[pgoutbox.Lane]bool      // lanes without unpublished events: back to the stream
}

// pickDue returns the lanes due at now (at most BatchSize/RunLength of them, in
// lane order) and when the first lane not picked comes due (now if some due
// lanes were left for the next round; at most PollInterval away).
func (s *Source) pickDue(now time.Time) ([]pgoutbox.Lane, time.Time) {
	next := now.Add(s.cfg.PollInterval)
	limit := max(1, s.cfg.BatchSize/s.cfg.RunLength)
	var picked []pgoutbox.Lane
	s.mu.Lock()
	for l, st := range s.blocked {
		if !st.due.After(now) {
			picked = append(picked, l)
		} else if st.due.Before(next) {
			next = st.due
		}
	}
	s.mu.Unlock()
	// Oldest-due first would be fairer; lane order keeps it simple and deterministic.
	slices.SortFunc(picked, pgoutbox.Lane.Compare)
	if len(picked) > limit {
		next = now
		picked = picked[:limit]
	}
	return picked, next
}

// readLanes reads the first RunLength unpublished events of each lane. It
// returns false if the source was hard-stopped first.
func (s *Source) readLanes(picked []pgoutbox.Lane) ([]tableRow, bool) {
	types, ids := make([]string, len(picked)), make([]string, len(picked))
	for i, l := range picked {
		types[i], ids[i] = l.AggregateType, l.AggregateID
	}
	var rows []tableRow
	ok := s.retryDB("read owned lanes", func(ctx context.Context) error {
		r, err := s.pool.Query(ctx, s.q.laneRows, types, ids, s.cfg.Owner(), s.cfg.RunLength)
		if err != nil {
			return err
		}
		rows, err = pgx.CollectRows(r, scanTableRow)
		return err
	})
	for i := range rows {
		// As the polling relay and the slot's decoder fill them: {tenant} in a
		// destination and the CloudEvents source are the same on this path.
		rows[i].Msg.Tenant, rows[i].Msg.Schema = s.cfg.Schema, s.cfg.Schema
	}
	return rows, ok
}

func scanTableRow(row pgx.CollectableRow) (tableRow, error) {
	var t tableRow
	var headers []byte
	var notBefore *time.Time
	err := row.Scan(&t.Msg.EventID, &t.Msg.AggregateType, &t.Msg.AggregateID, &t.Msg.AggregateSequence,
		&t.Msg.EventType, &t.Msg.SchemaVersion, &t.Msg.Payload, &headers, &t.Msg.OccurredAt,
		&t.Attempts, &t.quarantined, &notBefore, &t.dbNow)
	if err == nil {
		t.Msg.Headers, t.Refused = pipeline.DecodeHeaders("cdc", t.Msg.EventID, headers)
	}
	if notBefore != nil {
		t.notBefore = *notBefore
	}
	return t, err
}

// planRound goes through each lane's rows in sequence order: the events that
// may go now are candidates, up to the first quarantined one (which waits for
// an operator, looked at every PollInterval) or the first still backing off
// (looked at when its backoff ends).
func (s *Source) planRound(picked []pgoutbox.Lane, rows []tableRow, now time.Time) (roundPlan, []item) {
	p := roundPlan{due: map[pgoutbox.Lane]time.Time{}, empty: map[pgoutbox.Lane]bool{}}
	for _, l := range picked {
		p.empty[l] = true
	}
	var candidates []item
	stopped := map[pgoutbox.Lane]bool{}
	for i := range rows {
		r := &rows[i]
		l := r.Lane()
		p.empty[l] = false
		if stopped[l] {
			continue
		}
		switch {
		case r.quarantined:
			stopped[l] = true
			p.due[l] = now.Add(s.cfg.PollInterval)
		case r.notBefore.After(r.dbNow):
			stopped[l] = true
			p.due[l] = now.Add(r.notBefore.Sub(r.dbNow))
		default:
			candidates = append(candidates, item{Event: r.Event})
		}
	}
	return p, candidates
}

// leaseCandidates takes the candidates' leases (an operator's retry cleared
// them) and returns, per lane, the prefix actually taken; a lane cut short is
// looked at again after PollInterval. It returns false if the source was
// hard-stopped first.
func (s *Source) leaseCandidates(candidates []item, p roundPlan, now time.Time) ([]item, bool) {
	if len(candidates) == 0 {
		return nil, true
	}
	cids := make([]pgoutbox.UUID, len(candidates))
	for i := range candidates {
		cids[i] = candidates[i].Msg.EventID
	}
	var got []pgoutbox.UUID
	if !s.retryDB("lease owned events", func(ctx context.Context) error {
		r, err := s.pool.Query(ctx, s.q.lease, pgUUIDs(cids), s.cfg.Owner())
		if err != nil {
			return err
		}
		got, err = collectIDs(r)
		return err
	}) {
		return nil, false
	}
	ok := map[pgoutbox.UUID]bool{}
	for _, id := range got {
		ok[id] = true
	}
	var send []item
	cut := map[pgoutbox.Lane]bool{}
	for _, c := range candidates {
		l := c.Lane()
		if cut[l] || !ok[c.Msg.EventID] {
			cut[l] = true
			p.due[l] = now.Add(s.cfg.PollInterval)
			continue
		}
		send = append(send, c)
	}
	return send, true
}

// publishFromTable publishes the leased events and settles them; a lane with a
// failed event comes due when its backoff ends, and an ack wakes a dispatcher
// pausing for a broker outage. It returns false if the source was hard-stopped
// before the outcome was recorded.
func (s *Source) publishFromTable(send []item, p roundPlan, now time.Time) bool {
	results, took := pipeline.Publish(s.hardCtx, &s.pipe, send)
	res, done := s.settle(PathTable, send, results, took)
	if !done {
		return false
	}
	s.stats.fromTable.Add(int64(res.acked))
	if res.acked > 0 {
		s.brokerBack.Poke()
	}
	for l, delay := range res.failedLanes {
		p.due[l] = now.Add(delay)
	}
	return true
}

// reschedule sets when each picked lane is looked at next (at once for a lane
// that published a run and has more), hands lanes without unpublished events
// back to the stream, and returns whether the round did anything and when the
// next lane comes due.
func (s *Source) reschedule(picked []pgoutbox.Lane, p roundPlan, now, next time.Time, progressed bool) (bool, time.Time) {
	var back []pgoutbox.Lane
	for _, l := range picked {
		if p.empty[l] {
			back = append(back, l)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for l, at := range p.due {
		if st := s.blocked[l]; st != nil {
			st.due = at
		}
	}
	for _, l := range picked {
		if _, set := p.due[l]; !set && !p.empty[l] {
			if st := s.blocked[l]; st != nil {
				st.due = now // published a run: look for more at once
			}
		}
	}
	if len(back) > 0 {
		n := s.unblockLocked(back)
		progressed = progressed || n > 0
	}
	for _, st := range s.blocked {
		if st.due.Before(next) {
			next = st.due
		}
	}
	return progressed, next
}

// unblockLocked hands lanes back to the stream when every event up to the
// highest sequence the stream skipped is published (unblockableSQL). It holds
// s.mu throughout, so the dispatcher cannot skip a further event of such a lane
// between the check and the hand-back: events it sees afterwards are newer than
// anything the table path published, and go out from the stream in order.
func (s *Source) unblockLocked(lanes []pgoutbox.Lane) int {
	types, ids, seen := make([]string, len(lanes)), make([]string, len(lanes)), make([]int64, len(lanes))
	for i, l := range lanes {
		types[i], ids[i], seen[i] = l.AggregateType, l.AggregateID, s.blocked[l].seen
	}
	ctx, cancel := context.WithTimeout(s.hardCtx, StatementTimeout)
	defer cancel()
	r, err := s.pool.Query(ctx, s.q.unblockable, types, ids, seen)
	if err != nil {
		s.log.Debug("could not hand lanes back to the stream", slog.Any("error", err))
		return 0
	}
	var checkUntil pglogrepl.LSN
	back, err := pgx.CollectRows(r, func(row pgx.CollectableRow) (pgoutbox.Lane, error) {
		var l pgoutbox.Lane
		var at string
		if err := row.Scan(&l.AggregateType, &l.AggregateID, &at); err != nil {
			return l, err
		}
		lsn, err := pglogrepl.ParseLSN(at)
		checkUntil = max(checkUntil, lsn)
		return l, err
	})
	if err != nil {
		s.log.Debug("could not hand lanes back to the stream", slog.Any("error", err))
		return 0
	}
	for _, l := range back {
		delete(s.blocked, l)
	}
	s.checkUntil = max(s.checkUntil, checkUntil)
	// The others are looked at again later: the skipped event is not visible yet
	// (its commit is being made visible), or it was deleted.
	later := time.Now().Add(s.cfg.PollInterval)
	for _, l := range lanes {
		if st := s.blocked[l]; st != nil {
			st.due = later
		}
	}
	return len(back)
}

// BlockedLanes returns how many lanes the table path owns.
func (s *Source) BlockedLanes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.blocked)
}
