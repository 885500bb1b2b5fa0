// Package kafkainbox feeds outbox events from Apache Kafka (or a Kafka-compatible
// broker) to an inbox consumer, as a member of a consumer group.
//
// Every instance of one logical consumer runs a Subscriber in the same group; Kafka
// spreads the topics' partitions over them. Each record becomes an [inbox.Delivery]
// (the record headers, the value as body) for an [inbox.Processor] — normally an
// *inbox.Consumer — and the Subscriber acts on the outcome only after the consumer
// transaction has ended:
//
//	applied, duplicate    done: its offset may be committed
//	gap-rejected, failed  processed again in place after Outcome.RetryAfter;
//	                      the partition waits, other partitions go on
//	undecodable           logged as an error and skipped: done
//
// # Order and the offset commit rule
//
// The publisher keys each record by aggregate id, so all events of an aggregate
// are in one partition, in sequence order. The Subscriber runs one goroutine per
// assigned partition (franz-go's "goroutine per partition" pattern) that processes
// the partition's records one at a time, in offset order: per-aggregate order
// comes from per-partition order. Config.Concurrency bounds how many partitions
// are inside Process at once.
//
// Kafka has one committed offset per partition and group, and committing offset n
// says "every record below n is done". So the Subscriber commits, for each
// partition, the offset after the last record whose outcome was done — never
// past a record that is still being processed or retried, and never before the
// consumer transaction of that record committed. Autocommit is disabled;
// finished offsets are committed every Config.CommitInterval, when partitions are
// revoked, and when the Subscriber stops.
//
// # Retrying in place
//
// Kafka has no per-message negative acknowledgement: a record that is not done
// cannot be put aside without committing past it, which would lose it. A
// gap-rejected or failed record is therefore processed again, after
// Outcome.RetryAfter (the inbox's backoff, Delivery.Attempt counts the attempts),
// until it is done; the records behind it in its partition wait, while the other
// partitions continue. A record that fails forever (a handler bug) stops its
// partition — and with it every aggregate in that partition — until a fix is
// deployed, unless Config.MaxAttempts lets the Subscriber skip it (logged as an
// error; under inbox.GapReject that aggregate then waits for a reconciliation,
// see [inbox.Consumer.SetPosition]). While a partition waits, its fetched records
// stay buffered up to Config.MaxBufferedRecords, then fetching that partition
// pauses.
//
// A gap inside one partition is rare, as the relay puts an aggregate's events there
// in sequence order. It means the missing event is in another topic (a topic
// template by event type), which the partition waits for, or that it will never
// come (skipped upstream, deleted by retention): the partition then waits, retried
// every inbox.Config.MaxGapRetryDelay at most, until the consumer's position is
// reconciled.
//
// # Rebalances
//
// The client blocks rebalances while the records of a poll are handed to the
// partition goroutines (kgo.BlockRebalanceOnPoll), which never blocks for long.
// When partitions are revoked, their goroutines stop: a record inside Process is
// finished (its transaction commits or rolls back, at most Config.ProcessTimeout,
// which must stay below the group's rebalance timeout), a record waiting for a
// retry is abandoned, queued records are dropped; then the finished offsets of
// those partitions are committed synchronously, before the rebalance goes on. The
// new owner starts right after the last finished record — a record that was
// being retried is processed again by it, never skipped. When partitions are lost
// (the member was fenced from the group), committing is impossible; the
// goroutines stop the same way and the new owner re-reads from the last commit.
//
// # Crash safety
//
// A record is committed to Kafka only after its consumer transaction committed,
// so a crash can only leave a record done in PostgreSQL and not committed in
// Kafka — never the reverse:
//
//	crash point                                   what happens next
//	before the consumer commit                    rolled back; the record is re-read and applied
//	after the consumer commit, before the         re-read by the partition's next owner: the inbox
//	  Kafka offset commit                           finds it applied and reports a duplicate (no
//	                                                second effect); its offset is then committed
//	after the offset commit                       nothing to do
//
// Up to Config.CommitInterval of finished records (plus whatever was in flight)
// are re-read after a crash; each costs one short transaction that finds a
// duplicate. Stop and revocations commit everything finished, so a graceful
// restart re-reads nothing.
//
// # Shared parts
//
// The Subscriber starts and stops as every pgoutbox service does
// (internal/lifecycle) and passes the subscriber conformance suite
// (inbox/inboxtest). It does not use the per-message core of natsinbox and
// rabbitinbox (inbox/internal/subscriber): Kafka settles by offset, not message
// by message, so there is no ack, nak or release per record; order is per
// partition, not per aggregate lane; a gap-rejected or failed record is retried
// in place, holding its partition, instead of being handed back for redelivery.
//
// Outside the standard library it pulls in franz-go, besides what package inbox
// pulls in (pgx, the OpenTelemetry API).
package kafkainbox
