package checker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/migrate"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Querier runs a query: *pgxpool.Pool, *pgx.Conn and pgx.Tx are Queriers.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// ReadOutbox returns every row of schema's outbox_events. ctx bounds the query.
func ReadOutbox(ctx context.Context, db Querier, schema string) ([]OutboxRow, error) {
	if err := migrate.ValidateSchema(schema); err != nil {
		return nil, fmt.Errorf("checker: %w", err)
	}
	rows, err := db.Query(ctx, `SELECT event_id, aggregate_type, aggregate_id, aggregate_sequence, published_at IS NOT NULL
		FROM `+pgx.Identifier{schema, "outbox_events"}.Sanitize())
	if err != nil {
		return nil, fmt.Errorf("checker: read outbox: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OutboxRow, error) {
		var o OutboxRow
		err := r.Scan(&o.EventID, &o.AggregateType, &o.AggregateID, &o.Sequence, &o.Published)
		return o, err
	})
	if err != nil {
		return nil, fmt.Errorf("checker: read outbox: %w", err)
	}
	return nonNil(out), nil
}

// ReadBusiness runs query, which must return (business key text, event id uuid)
// for each business row, e.g. "SELECT order_id, event_id FROM app.orders".
func ReadBusiness(ctx context.Context, db Querier, query string, args ...any) ([]BusinessRow, error) {
	rows, err := db.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("checker: read business rows: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (BusinessRow, error) {
		var b BusinessRow
		err := r.Scan(&b.Key, &b.EventID)
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("checker: read business rows: %w", err)
	}
	return nonNil(out), nil
}

// ReadEffects runs query, which must return (consumer text, event id uuid,
// aggregate type text, aggregate id text, sequence bigint) for every application
// of an effect, in application order: e.g. "SELECT consumer, event_id,
// aggregate_type, aggregate_id, sequence FROM app.effects ORDER BY n" over a table
// filled by the handler with a bigserial n and no unique constraint.
func ReadEffects(ctx context.Context, db Querier, query string, args ...any) ([]Effect, error) {
	rows, err := db.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("checker: read effects: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Effect, error) {
		var e Effect
		err := r.Scan(&e.Consumer, &e.EventID, &e.AggregateType, &e.AggregateID, &e.Sequence)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("checker: read effects: %w", err)
	}
	return nonNil(out), nil
}

// fetchMaxWait bounds how long one fetch of ReadJetStream waits for messages;
// near ctx's deadline it waits what is left, but at least fetchMinWait.
const (
	fetchMaxWait = 5 * time.Second
	fetchMinWait = 100 * time.Millisecond
)

// ReadJetStream returns every message of a JetStream stream, in stream order,
// decoded from the Outbox-* headers. A missing stream reads as empty; a message
// that is not an outbox event is an error. ctx bounds the whole read.
func ReadJetStream(ctx context.Context, js jetstream.JetStream, stream string) ([]Message, error) {
	out := []Message{}
	s, err := js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("checker: stream %s: %w", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("checker: stream %s: %w", stream, err)
	}
	last := info.State.LastSeq
	if info.State.Msgs == 0 {
		return out, nil
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, fmt.Errorf("checker: stream %s: ordered consumer: %w", stream, err)
	}
	for {
		wait := fetchMaxWait
		if d, ok := ctx.Deadline(); ok {
			wait = max(min(wait, time.Until(d)), fetchMinWait)
		}
		// Ask for no more than the stream holds: a fetch still waiting for
		// messages that never come outlives this function by its MaxWait.
		want := int(min(1000, max(info.State.Msgs-uint64(len(out)), 1)))
		batch, err := c.Fetch(want, jetstream.FetchMaxWait(wait))
		if err != nil {
			return nil, fmt.Errorf("checker: stream %s: fetch: %w", stream, err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			md, err := msg.Metadata()
			if err != nil {
				return nil, fmt.Errorf("checker: stream %s: %w", stream, err)
			}
			h := msg.Headers()
			names := slices.Collect(maps.Keys(h))
			m, err := wire.ParseReceived(msg.Data(), names, h.Get) // either wire format
			if err != nil {
				return nil, fmt.Errorf("checker: stream %s, sequence %d (%s): %w", stream, md.Sequence.Stream, msg.Subject(), err)
			}
			out = append(out, Message{EventID: m.EventID, AggregateType: m.AggregateType, AggregateID: m.AggregateID, Sequence: m.AggregateSequence,
				OccurredAt: m.OccurredAt, StoredAt: md.Timestamp})
			if md.Sequence.Stream >= last {
				return out, nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, natsgo.ErrTimeout) {
			return nil, fmt.Errorf("checker: stream %s: fetch: %w", stream, err)
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("checker: stream %s: read %d messages, then: %w", stream, len(out), ctx.Err())
		}
		if n == 0 {
			return nil, fmt.Errorf("checker: stream %s: read %d messages, stream ends at sequence %d, then nothing came", stream, len(out), last)
		}
	}
}

// FromBroker converts broker messages (as natstest.Target.Read returns them).
func FromBroker(msgs []broker.Message) []Message {
	out := make([]Message, len(msgs))
	for i, m := range msgs {
		out[i] = Message{EventID: m.EventID, AggregateType: m.AggregateType, AggregateID: m.AggregateID, Sequence: m.AggregateSequence,
			OccurredAt: m.OccurredAt}
	}
	return out
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
