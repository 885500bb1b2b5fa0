// Package pgoutbox is a transactional outbox for Go services on PostgreSQL.
//
// A service writes its business rows and an outbox event in one local transaction;
// a relay (package relay, command "pgoutbox relay") later publishes committed events
// to a broker, at least once and in order per aggregate; consumers apply each event
// exactly once through an inbox table (package inbox).
//
// This package is what a producer imports. Outside the standard library it pulls
// in pgx and the OpenTelemetry trace API, and nothing else: no broker client ends
// up in your binary.
//
// # Writing events
//
// Create the tables once with package migrate (or "pgoutbox migrate"), then enqueue
// inside the transaction that changes your data:
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, "UPDATE orders SET status = 'paid' WHERE id = $1", id); err != nil {
//			return err
//		}
//		_, err := pgoutbox.EnqueueTx(ctx, tx, pgoutbox.Event{
//			AggregateType: "order", AggregateID: id, EventType: "order.paid", Payload: paid,
//		})
//		return err
//	})
//
// [Producer.QueueTx] puts the enqueue statement in a pgx.Batch beside the business
// statements, so the event costs no round trip of its own.
// [Producer.EnqueueSQLTx] does the same as EnqueueTx for database/sql. The SQL function
// outbox_enqueue(aggregate_type, aggregate_id, event_type, payload, schema_version,
// headers) enqueues from psql, triggers or other languages with the same rules.
//
// # What is guaranteed
//
// A committed transaction leaves exactly one outbox row per enqueued event; a
// rolled-back one leaves none. Events of one aggregate (AggregateType, AggregateID)
// get sequence numbers 1, 2, 3, … without gaps, in commit order, consecutive within
// a transaction: the relay publishes them in that order. Allocating a sequence locks
// the aggregate's counter row until the transaction ends, so writers of one
// aggregate queue up behind each other while other aggregates proceed in parallel.
//
// Event ids are UUIDv7, fixed at enqueue time and the same on every delivery, so
// consumers can deduplicate on them.
//
// Invalid events (empty or over-long names, payloads that are not JSON or that
// jsonb would refuse, payloads whose stored text is over Config.MaxPayloadBytes,
// headers beyond MaxHeaders or MaxHeaderBytes, header names that are not tokens or
// that a broker or HTTP acts on — see [ReservedHeader]) are rejected with a
// [*ValidationError] before any SQL is sent, so the caller's transaction stays
// usable. Headers are data for the consumer, never broker control. The limits are
// this package's Max… constants; outbox_enqueue checks the same ones, and the relay
// quarantines a row written around both.
package pgoutbox
