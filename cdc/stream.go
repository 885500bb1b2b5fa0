package cdc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/retry"
)

// ErrSlotMissing is reported (through the logs and Healthy) when the slot
// disappeared while the source ran: run Recover.
var ErrSlotMissing = errors.New("cdc: replication slot does not exist")

// redactedError shows text (the error made fit for logs and Healthy by
// retry.ErrorText) and unwraps to err, so that errors.Is still matches it.
type redactedError struct {
	text string
	err  error
}

func (e redactedError) Error() string { return e.text }
func (e redactedError) Unwrap() error { return e.err }

// stream keeps a replication connection open, reconnecting with backoff, and
// queues every committed transaction's outbox inserts.
func (s *Source) stream(ready chan<- error) {
	var wait retry.Backoff
	first := true
	defer func() {
		if first {
			ready <- errors.New("cdc: stopped before the replication stream started")
		}
	}()
	for {
		err := s.streamOnce(func() {
			if first {
				first = false
				ready <- nil
			}
			if s.streamDown.Swap(nil) != nil {
				s.log.Info("replication stream up again")
			}
			s.standbyWake.Poke() // the hold waits for this server's standbys (standby.go)
			wait.Reset()
		})
		select {
		case <-s.stopping:
			return
		default:
		}
		if s.hardCtx.Err() != nil {
			return
		}
		if first {
			first = false
			ready <- err
			return
		}
		why := error(redactedError{text: retry.ErrorText(err), err: err})
		if s.streamDown.Swap(&why) == nil {
			s.log.Warn("replication stream down; reconnecting with backoff", slog.Any("error", err))
		}
		t := time.NewTimer(wait.Next())
		select {
		case <-s.stopping:
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (s *Source) streamOnce(up func()) error {
	ctx := s.hardCtx
	conn, err := replConn(ctx, s.pool)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	// Who decodes: the hold releases transactions only on this server's word.
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return fmt.Errorf("cdc: identify the replication connection's server: %w", err)
	}
	defer s.streamEnded()
	args := []string{"proto_version '1'", "publication_names " + quoteLiteral(s.cfg.Publication)}
	// Position 0: the server starts at the slot's confirmed position.
	if err := pglogrepl.StartReplication(ctx, conn, s.cfg.Slot, 0, pglogrepl.StartReplicationOptions{PluginArgs: args}); err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			switch pe.Code {
			case "55006":
				return fmt.Errorf("%w: %s", ErrSlotActive, pe.Message)
			case "42704":
				return fmt.Errorf("%w: slot %q: run 'pgoutbox cdc recover --schema %s'", ErrSlotMissing, s.cfg.Slot, s.cfg.Schema)
			}
		}
		return fmt.Errorf("cdc: start replication: %w", err)
	}
	s.streamUp(serverID{system: sys.SystemID, timeline: int64(sys.Timeline), pid: conn.PID()}, sys.XLogPos)
	up()

	var (
		relations  = map[uint32]*relation{}
		cur        *txn
		reported   pglogrepl.LSN
		lastStatus time.Time
		replyNow   bool
		dec        = decoder{types: pgtype.NewMap(), schema: s.cfg.Schema}
		win        receiveWindow
		sendStatus = func() error {
			lsn := s.reportable()
			err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
				WALWritePosition: lsn, WALFlushPosition: lsn, WALApplyPosition: lsn})
			if err != nil {
				return fmt.Errorf("cdc: send standby status: %w", err)
			}
			reported, lastStatus, replyNow = lsn, time.Now(), false
			if s.cfg.Observer != nil {
				s.cfg.Observer.PositionConfirmed(Position{LSN: lsn, Lag: s.lag()})
			}
			return nil
		}
	)
	defer win.end()
	for {
		select {
		case <-s.stopping:
			// The dispatcher settles its last batch before the workers stop; report
			// where it got to. Stop waits for this goroutine.
			s.waitDispatcherIdle()
			return sendStatus()
		default:
		}
		since := time.Since(lastStatus)
		if replyNow || since >= s.cfg.StatusInterval || (s.reportable() > reported && since >= minStatusInterval) {
			if err := sendStatus(); err != nil {
				return err
			}
		}
		if cur == nil && s.full() {
			// Back-pressure: stop reading (the server buffers) but keep reporting,
			// so the server does not time the connection out.
			t := time.NewTimer(backPressurePoll)
			select {
			case <-s.space:
			case <-t.C:
			case <-s.stopping:
			}
			t.Stop()
			continue
		}
		raw, err := conn.ReceiveMessage(win.context(ctx))
		if err != nil {
			if pgconn.Timeout(err) && ctx.Err() == nil {
				win.end()
				continue
			}
			return fmt.Errorf("cdc: receive: %w", err)
		}
		switch m := raw.(type) {
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("cdc: replication stream: %w", pgconn.ErrorResponseToPgError(m))
		case *pgproto3.CopyDone:
			return errors.New("cdc: the server ended the replication stream")
		case *pgproto3.CopyData:
			if len(m.Data) == 0 {
				continue
			}
			switch m.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				k, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:])
				if err != nil {
					return fmt.Errorf("cdc: keepalive: %w", err)
				}
				if cur == nil {
					// Everything before this position was sent and, outside a
					// transaction, received whole.
					s.mu.Lock()
					s.walEnd = max(s.walEnd, k.ServerWALEnd)
					s.mu.Unlock()
				}
				replyNow = replyNow || k.ReplyRequested
			case pglogrepl.XLogDataByteID:
				x, err := pglogrepl.ParseXLogData(m.Data[1:])
				if err != nil {
					return fmt.Errorf("cdc: xlog data: %w", err)
				}
				if len(x.WALData) > 0 && x.WALData[0] == 'I' {
					// Inserts, nearly every message, are decoded here (decode.go).
					relID, tuple, err := parseInsert(x.WALData)
					if err != nil {
						return fmt.Errorf("cdc: decode pgoutput message: %w", err)
					}
					rel := relations[relID]
					if rel == nil {
						return fmt.Errorf("cdc: insert into unknown relation %d", relID)
					}
					if cur == nil || !rel.outbox {
						continue
					}
					msg, refused, err := dec.insert(rel, tuple, &cur.mem)
					if err != nil {
						return err
					}
					if refused != nil {
						if cur.refused == nil {
							cur.refused = map[pgoutbox.UUID]error{}
						}
						cur.refused[msg.EventID] = refused
					}
					cur.events = append(cur.events, msg)
					continue
				}
				lm, err := pglogrepl.Parse(x.WALData)
				if err != nil {
					return fmt.Errorf("cdc: decode pgoutput message: %w", err)
				}
				switch lm := lm.(type) {
				case *pglogrepl.RelationMessage:
					relations[lm.RelationID] = dec.relation(lm)
				case *pglogrepl.BeginMessage:
					cur = &txn{commit: lm.CommitTime}
				case *pglogrepl.CommitMessage:
					if cur != nil {
						cur.end = lm.TransactionEndLSN
						s.push(cur)
						cur = nil
					}
				}
			}
		}
	}
}

// receiveWindow is the context of the stream's receives: one serves every
// message of a receiveWait window (one per message, a timer each, cost more
// than decoding the message), so that a receive returns at least every
// receiveWait for the status reports and Stop.
type receiveWindow struct {
	ctx      context.Context
	cancel   context.CancelFunc
	deadline time.Time
}

// context returns the window's context, opening a new window when the last one
// ended or expired.
func (w *receiveWindow) context(parent context.Context) context.Context {
	if now := time.Now(); w.ctx == nil || !now.Before(w.deadline) {
		w.end()
		w.deadline = now.Add(receiveWait)
		w.ctx, w.cancel = context.WithDeadline(parent, w.deadline)
	}
	return w.ctx
}

// end ends the window (a receive timed out: its context is done).
func (w *receiveWindow) end() {
	if w.cancel != nil {
		w.cancel()
	}
	w.ctx, w.cancel = nil, nil
}

// waitDispatcherIdle gives the dispatcher a moment to settle its last batch so
// that the final status report covers it.
func (s *Source) waitDispatcherIdle() {
	deadline := time.Now().Add(s.cfg.PublishTimeout + settleGrace)
	for s.inFlight.Load() > 0 && time.Now().Before(deadline) && s.hardCtx.Err() == nil {
		time.Sleep(idlePoll)
	}
}
