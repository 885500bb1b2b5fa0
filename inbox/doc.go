// Package inbox applies delivered outbox events exactly once: the consumer side of
// pgoutbox.
//
// Delivery is at least once — relays re-publish after a crash, brokers redeliver
// what was not acked — so a consumer must make duplicates harmless. The inbox does
// it the only way that holds under crashes: the record "consumer C applied event E"
// and E's business effect commit in ONE transaction of the consumer's database.
// Writing them in two transactions would recreate the dual write the outbox exists
// to avoid.
//
// # The transaction
//
// [Consumer.Process] takes one [Delivery] (a message as any broker hands it over),
// decodes it into an [Event], upcasts the payload, and then, in one transaction:
//
//  1. locks the consumer's row of the event's aggregate in consumer_positions and
//     reads the last sequence applied;
//  2. INSERT INTO processed_events (consumer_name, event_id) ... ON CONFLICT DO
//     NOTHING RETURNING — unless the gap policy refuses the event;
//  3. only when a row came back, runs the [Handler] with the transaction (a pgx.Tx
//     or a *sql.Tx, see [Pgx] and [SQL]) and advances the position;
//  4. commits.
//
// Only then does the outcome say "ack". A subscriber that acks after Process
// returns can crash at any point: before the commit nothing happened, after it the
// redelivery is recognised.
//
// Two transactions racing on one event (two instances got it, or a redelivery
// overtook a slow first delivery) meet at step 1: the second waits for the first's
// lock, then reads the position the first committed and finds a duplicate — or, if
// the first rolled back, applies the event itself. Should it reach step 2 while the
// first holds an uncommitted processed_events row, it waits on that row the same way.
// Either way nobody sees an error.
//
// # Outcomes
//
//	Status            written                                  Action
//	applied           effect + processed_events + position     ack (after commit)
//	duplicate         nothing                                  ack
//	gap-rejected      nothing (rolled back)                    nak, redeliver after RetryAfter
//	failed            nothing (rolled back)                    nak, redeliver after RetryAfter
//	undecodable       nothing                                  term (never redelivered)
//
// A duplicate is an event whose processed_events row exists, or, under GapReject,
// whose sequence is not above the consumer's position for its aggregate (applied, or
// declared done by [Consumer.SetPosition]); one found by its sequence alone, its id
// never applied, is reported (Outcome.ByPosition, a WARN line): after an
// asynchronous failover of the producers' database a sequence may be allocated
// again to another event. Failed covers handler errors and panics,
// upcaster errors and database errors; serialization failures and deadlocks are
// first retried in-process (Config.TxRetries). The delay before a failed delivery
// comes back doubles with each attempt (Config.RetryDelay); an event rejected for a
// gap comes back after Config.GapRetryDelay per missing sequence, so the events
// queued behind a missing one return in order.
//
// # Order and gaps
//
// Each consumer keeps, per aggregate, the last sequence it applied. An event more
// than one past it has a gap before it, and [Config.GapPolicy] decides:
// [GapReject] (the default) refuses it, so each aggregate is applied strictly in
// order, the event being redelivered once its predecessors are in; [GapAccept]
// applies it and reports the gap, and applies late events when they come.
//
// An event that will never come — skipped upstream with "pgoutbox dlq skip", lost to
// a broker's retention — holds its aggregate under GapReject until an operator
// declares it done with [Consumer.SetPosition] (or the SQL in docs/consumer.md). A
// new consumer that starts mid-stream needs its positions seeded the same way.
//
// # Remote side effects
//
// The transaction covers only the consumer's database. A handler that also calls a
// payment provider, sends mail or fires a webhook can crash after the call and
// before the commit; the event is then delivered again and the call repeated. Pass
// [IdempotencyKey] (the event id) to the remote service so that it drops the repeat;
// if it cannot, put a command in your own outbox and reconcile, or accept the risk
// knowingly.
//
// # Retention
//
// processed_events grows by one row per event and consumer. [Cleanup] deletes rows
// older than a retention in bounded batches, and refuses a retention shorter than
// the replay horizon — the longest time after which an applied event can be
// delivered again — because a redelivery after its row is gone would apply twice.
// Positions are never deleted.
//
// # Subscribers and metrics
//
// [Processor] is the broker-neutral seam: a subscriber builds a [Delivery], calls
// Process, and acts on [Outcome.Action]. Packages inbox/natsinbox (NATS JetStream),
// inbox/kafkainbox (Kafka consumer groups) and inbox/rabbitinbox (RabbitMQ) are the
// subscribers; one for another broker is a small package that does the same. [Config.Observer] receives every outcome; package inbox/inboxprom turns them
// into Prometheus metrics. docs/consumer.md covers all of this in more depth.
//
// Outside the standard library it pulls in pgx and the OpenTelemetry API, as the
// root package does: no broker client.
package inbox
