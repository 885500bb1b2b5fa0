// Package relayprom exports a relay's work and the outbox's backlog as Prometheus
// metrics.
//
// Two collectors, registered on a prometheus.Registerer you pass:
//
// [Metrics] implements relay.Observer (set it as relay.Config.Observer) and counts
// what the relay does:
//
//	pgoutbox_relay_published_total                 events acknowledged by the broker and marked published
//	pgoutbox_relay_publish_failures_total{reason}  failed publish attempts: permanent, unavailable or error
//	pgoutbox_relay_quarantined_total               events quarantined (poison)
//	pgoutbox_relay_leases_taken_over_total         leases (runs) claimed from another relay's expired lease
//	pgoutbox_relay_publish_attempts                histogram: attempt number at which events were published (1 = first try)
//	pgoutbox_relay_broker_ack_seconds              histogram: time for the broker to answer for a whole batch
//	pgoutbox_relay_batch_size                      histogram: events leased per claim
//	pgoutbox_relay_claim_seconds                   histogram: duration of a claim
//	pgoutbox_cleanup_deleted_rows_total{table}     rows deleted by cleanup (fed by Metrics.CleanupDeleted)
//
// A relay with destinations (relay.Config.Destinations) counts its deliveries
// in the metrics above, summed over its destinations, and per destination in
// three more, which a relay with one publisher leaves without series:
//
//	pgoutbox_relay_destination_published_total{destination}                 events a destination's broker acknowledged
//	pgoutbox_relay_destination_publish_failures_total{destination,reason}   failed publish attempts to a destination, by reason
//	pgoutbox_relay_destination_quarantined_total{destination}               a destination's lanes quarantined at a poison event
//
// [Outbox] reads the backlog from the database with one cheap query over the
// unpublished rows (the partial index outbox_events_unpublished_idx), at most
// once per Outbox.MaxAge, when scraped:
//
//	pgoutbox_relay_pending_events                  unpublished, not quarantined events (in backoff or not)
//	pgoutbox_relay_oldest_pending_age_seconds      age of the oldest of them: THE health figure
//	pgoutbox_relay_quarantined_events              quarantined events waiting for an operator
//	pgoutbox_relay_outbox_table_bytes              outbox_events with its indexes and TOAST
//	pgoutbox_relay_up{dependency}                  1 when the database / broker answered last time, else 0
//
// The backlog gauges describe the whole outbox, not one relay: every replica
// reports the same figures, so aggregate them with max(), not sum().
// docs/operations.md has the alerts built on them.
//
// Outside the standard library it pulls in the Prometheus client, besides what
// package relay pulls in (pgx, the OpenTelemetry trace API).
package relayprom

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox/internal/promreg"
	"github.com/pgoutbox/pgoutbox/relay"
)

// Metrics counts a relay's claims and publishes. It implements relay.Observer
// and is safe for concurrent use; one Metrics may serve several relays of a
// process.
type Metrics struct {
	outcomes              *promreg.Outcomes
	takenOver             prometheus.Counter
	ackSeconds, batchSize prometheus.Histogram
	claimSeconds          prometheus.Histogram
	cleanupDeleted        *prometheus.CounterVec
	// Per destination, for a relay with destinations.
	destPublished, destFailures, destQuarantined *prometheus.CounterVec
}

// New creates the collectors and registers them on reg, which is required: pass
// prometheus.DefaultRegisterer explicitly to use the global registry. Collectors
// already registered on reg (by an earlier New) are reused.
func New(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		return nil, errors.New("relayprom: New needs a prometheus.Registerer")
	}
	r := &promreg.Registrar{Reg: reg, Subsystem: "relay"}
	m := &Metrics{
		outcomes: promreg.NewOutcomes(r, "publish_failures_total",
			"Failed publish attempts by reason: permanent (quarantined at once), unavailable (broker unreachable; retried, never quarantined) or error (quarantined after max attempts)."),
		takenOver: r.Counter("leases_taken_over_total",
			"Leases, each a run of one aggregate's events, claimed from another relay's expired lease (that relay died or stalled)."),
		ackSeconds: r.Histogram("broker_ack_seconds",
			"Time from publishing a batch until the broker answered for every message of it.", promreg.AckBuckets),
		batchSize:    r.Histogram("batch_size", "Events leased per claim.", promreg.BatchBuckets),
		claimSeconds: r.Histogram("claim_seconds", "Duration of a claim (the statements leasing a batch).", promreg.DatabaseBuckets),
		destPublished: r.CounterVec("destination_published_total",
			"Events acknowledged by a destination's broker (a relay with destinations).", "destination"),
		destFailures: r.CounterVec("destination_publish_failures_total",
			"Failed publish attempts to a destination by reason: permanent, unavailable or error (a relay with destinations).", "destination", "reason"),
		destQuarantined: r.CounterVec("destination_quarantined_total",
			"A destination's lanes quarantined at a poison event (a relay with destinations).", "destination"),
	}
	cleanup := &promreg.Registrar{Reg: reg, Subsystem: "cleanup", Err: r.Err}
	m.cleanupDeleted = cleanup.CounterVec("deleted_rows_total",
		"Rows deleted by retention cleanup, per table (outbox_events, processed_events, ...).", "table")
	if cleanup.Err != nil {
		return nil, fmt.Errorf("relayprom: %w", cleanup.Err)
	}
	return m, nil
}

// BatchClaimed implements relay.Observer.
func (m *Metrics) BatchClaimed(c relay.ClaimedBatch) {
	m.batchSize.Observe(float64(c.Events))
	m.claimSeconds.Observe(c.Duration.Seconds())
	if c.TakenOver > 0 {
		m.takenOver.Add(float64(c.TakenOver))
	}
}

// BatchSettled implements relay.Observer.
func (m *Metrics) BatchSettled(s relay.SettledBatch) {
	m.ackSeconds.Observe(s.PublishDuration.Seconds())
	m.outcomes.Settled(s.Events)
	if s.Destination != "" {
		m.destinationSettled(s.Destination, s.Events)
	}
}

// destinationSettled counts a destination's outcomes. The destination label
// has at most relay.MaxDestinations values per relay.
func (m *Metrics) destinationSettled(dest string, events []relay.EventOutcome) {
	published := 0
	for i := range events {
		switch e := &events[i]; e.Result {
		case relay.ResultPublished:
			published++
		case relay.ResultFailed, relay.ResultQuarantined:
			m.destFailures.WithLabelValues(dest, string(e.Reason)).Inc()
			if e.Result == relay.ResultQuarantined {
				m.destQuarantined.WithLabelValues(dest).Inc()
			}
		}
	}
	if published > 0 {
		m.destPublished.WithLabelValues(dest).Add(float64(published))
	}
}

// CleanupDeleted adds rows to pgoutbox_cleanup_deleted_rows_total{table}: retention
// cleanup calls it after each deleted batch (or dropped partition, with its row
// count).
func (m *Metrics) CleanupDeleted(table string, rows int64) {
	if rows > 0 {
		m.cleanupDeleted.WithLabelValues(table).Add(float64(rows))
	}
}

var _ relay.Observer = (*Metrics)(nil)
