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
// Imports the Prometheus client beyond package relay.
package relayprom

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox/relay"
)

const namespace = "pgoutbox"

// Metrics counts a relay's claims and publishes. It implements relay.Observer
// and is safe for concurrent use; one Metrics may serve several relays of a
// process.
type Metrics struct {
	published, quarantined, takenOver prometheus.Counter
	failures                          *prometheus.CounterVec
	failuresBy                        map[relay.FailureReason]prometheus.Counter
	attempts, ackSeconds, batchSize   prometheus.Histogram
	claimSeconds                      prometheus.Histogram
	cleanupDeleted                    *prometheus.CounterVec
}

// New creates the collectors and registers them on reg, which is required: pass
// prometheus.DefaultRegisterer explicitly to use the global registry. Collectors
// already registered on reg (by an earlier New) are reused.
func New(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		return nil, errors.New("relayprom: New needs a prometheus.Registerer")
	}
	m := &Metrics{}
	var err error
	counter := func(dst *prometheus.Counter, subsystem, name, help string) {
		if err == nil {
			*dst, err = register(reg, prometheus.NewCounter(prometheus.CounterOpts{
				Namespace: namespace, Subsystem: subsystem, Name: name, Help: help}))
		}
	}
	histogram := func(dst *prometheus.Histogram, name, help string, buckets []float64) {
		if err == nil {
			*dst, err = register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
				Namespace: namespace, Subsystem: "relay", Name: name, Help: help, Buckets: buckets}))
		}
	}
	counter(&m.published, "relay", "published_total", "Events acknowledged by the broker and marked published.")
	counter(&m.quarantined, "relay", "quarantined_total", "Events quarantined: a permanent broker refusal, or max attempts reached.")
	counter(&m.takenOver, "relay", "leases_taken_over_total", "Leases, each a run of one aggregate's events, claimed from another relay's expired lease (that relay died or stalled).")
	histogram(&m.attempts, "publish_attempts", "Attempt number at which events were published (1 = first try).",
		[]float64{1, 2, 3, 5, 10, 20, 50})
	histogram(&m.ackSeconds, "broker_ack_seconds", "Time from publishing a batch until the broker answered for every message of it.",
		[]float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30})
	histogram(&m.batchSize, "batch_size", "Events leased per claim.",
		[]float64{1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000})
	histogram(&m.claimSeconds, "claim_seconds", "Duration of a claim (the statements leasing a batch).",
		[]float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5})
	if err != nil {
		return nil, err
	}
	if m.failures, err = register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "relay", Name: "publish_failures_total",
		Help: "Failed publish attempts by reason: permanent (quarantined at once), unavailable (broker unreachable; retried, never quarantined) or error (quarantined after max attempts).",
	}, []string{"reason"})); err != nil {
		return nil, err
	}
	m.failuresBy = map[relay.FailureReason]prometheus.Counter{}
	for _, r := range []relay.FailureReason{relay.ReasonPermanent, relay.ReasonUnavailable, relay.ReasonError} {
		// Created up front so that rate() sees 0 before the first failure.
		m.failuresBy[r] = m.failures.WithLabelValues(string(r))
	}
	if m.cleanupDeleted, err = register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "cleanup", Name: "deleted_rows_total",
		Help: "Rows deleted by retention cleanup, per table (outbox_events, processed_events, ...).",
	}, []string{"table"})); err != nil {
		return nil, err
	}
	return m, nil
}

// register registers c on reg, or returns the collector of the same description
// that reg already has.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		var zero C
		return zero, fmt.Errorf("relayprom: register: %w", err)
	}
	return c, nil
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
	published := 0
	for i := range s.Events {
		o := &s.Events[i]
		switch o.Result {
		case relay.ResultPublished:
			published++
			m.attempts.Observe(float64(o.Attempt))
		case relay.ResultFailed, relay.ResultQuarantined:
			if c, ok := m.failuresBy[o.Reason]; ok {
				c.Inc()
			} else {
				m.failures.WithLabelValues(string(o.Reason)).Inc()
			}
			if o.Result == relay.ResultQuarantined {
				m.quarantined.Inc()
			}
		}
	}
	if published > 0 {
		m.published.Add(float64(published))
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
