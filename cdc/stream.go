package cdc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
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
			s.standbyWake.Poke() // the server may be another one, or reconfigured
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
	up()

	var (
		relations  = map[uint32]*pglogrepl.RelationMessage{}
		cur        *txn
		reported   pglogrepl.LSN
		lastStatus time.Time
		replyNow   bool
		dec        = decoder{types: pgtype.NewMap(), schema: s.cfg.Schema}
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
		rctx, cancel := context.WithTimeout(ctx, receiveWait)
		raw, err := conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if pgconn.Timeout(err) && ctx.Err() == nil {
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
				lm, err := pglogrepl.Parse(x.WALData)
				if err != nil {
					return fmt.Errorf("cdc: decode pgoutput message: %w", err)
				}
				switch lm := lm.(type) {
				case *pglogrepl.RelationMessage:
					relations[lm.RelationID] = lm
				case *pglogrepl.BeginMessage:
					cur = &txn{commit: lm.CommitTime}
				case *pglogrepl.InsertMessage:
					rel := relations[lm.RelationID]
					if rel == nil {
						return fmt.Errorf("cdc: insert into unknown relation %d", lm.RelationID)
					}
					if cur == nil || rel.Namespace != s.cfg.Schema || rel.RelationName != "outbox_events" {
						continue
					}
					msg, refused, err := dec.insert(rel, lm.Tuple)
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

// waitDispatcherIdle gives the dispatcher a moment to settle its last batch so
// that the final status report covers it.
func (s *Source) waitDispatcherIdle() {
	deadline := time.Now().Add(s.cfg.PublishTimeout + settleGrace)
	for s.inFlight.Load() && time.Now().Before(deadline) && s.hardCtx.Err() == nil {
		time.Sleep(idlePoll)
	}
}

// decoder turns pgoutput inserts into broker messages, field for field what the
// polling relay reads from the table.
type decoder struct {
	types  *pgtype.Map
	schema string
}

// insert decodes an insert into outbox_events. refused is why the row cannot be
// published although it decoded (its headers are not a JSON object of strings).
func (d *decoder) insert(rel *pglogrepl.RelationMessage, tuple *pglogrepl.TupleData) (m broker.Message, refused error, err error) {
	if tuple == nil {
		return m, nil, errors.New("cdc: insert without a tuple")
	}
	var seen int
	for i, col := range tuple.Columns {
		if i >= len(rel.Columns) {
			break
		}
		name := rel.Columns[i].Name
		if col.DataType != 't' { // NULL (no outbox column read here may be) or unchanged TOAST (updates only)
			continue
		}
		v := col.Data
		switch name {
		case "event_id":
			m.EventID, err = pgoutbox.ParseUUID(string(v))
		case "aggregate_type":
			m.AggregateType = string(v)
		case "aggregate_id":
			m.AggregateID = string(v)
		case "aggregate_sequence":
			m.AggregateSequence, err = strconv.ParseInt(string(v), 10, 64)
		case "event_type":
			m.EventType = string(v)
		case "schema_version":
			m.SchemaVersion, err = strconv.Atoi(string(v))
		case "payload":
			m.Payload = bytes.Clone(v)
		case "headers":
			if herr := json.Unmarshal(v, &m.Headers); herr != nil {
				m.Headers = nil
				refused = herr
			}
		case "occurred_at":
			err = d.types.Scan(pgtype.TimestamptzOID, pgtype.TextFormatCode, v, &m.OccurredAt)
		default:
			continue
		}
		if err != nil {
			return m, nil, fmt.Errorf("cdc: decode column %s of an insert into %s.outbox_events: %w", name, d.schema, err)
		}
		seen++
	}
	if seen < 9 {
		return m, nil, fmt.Errorf("cdc: an insert into %s.outbox_events lacks columns (got %d of 9): is the table migrated?", d.schema, seen)
	}
	if refused != nil {
		refused = fmt.Errorf("cdc: event %s refused before publishing: headers are not a JSON object of strings: %w", m.EventID, refused)
	}
	return m, refused, nil
}
