// Package cdcprom exports a CDC source's work as Prometheus metrics, the way
// relay/relayprom does for the polling relay.
//
// [Metrics] implements cdc.Observer (set it as cdc.Config.Observer) and counts
// what the source does:
//
//	pgoutbox_cdc_published_total                          events acknowledged by the broker and marked published
//	pgoutbox_cdc_publish_failures_by_reason_total{reason} failed publish attempts: permanent, unavailable or error
//	pgoutbox_cdc_quarantined_total                        events quarantined (poison)
//	pgoutbox_cdc_publish_attempts                         histogram: attempt number at which events were published (1 = first try)
//	pgoutbox_cdc_broker_ack_seconds{path}                 histogram: time for the broker to answer for a whole batch
//	pgoutbox_cdc_batch_size{path}                         histogram: events handed to the broker per batch
//	pgoutbox_cdc_settle_seconds                           histogram: time to record a batch's outcomes in the database
//	pgoutbox_cdc_confirmed_lsn                            the slot position last confirmed to the server (as a byte offset)
//	pgoutbox_cdc_standby_held_transactions                transactions decoded and held until the synchronous standbys have them
//	pgoutbox_cdc_failover_slot_ready{slot}                PostgreSQL 17+: 1 when a standby synchronises the failover slot (sync-ready with cdc.Config.StandbyURL), else 0
//
// path is "stream" (events from the replication slot) or "table" (lanes the
// table path owns after a failure or a backfill). The names mirror
// relayprom's with the pgoutbox_cdc_ prefix; the failures counter is
// ..._by_reason_total because (*cdc.Source).Collector already exports an
// unlabelled pgoutbox_cdc_publish_failures_total, and both are registered on
// one registry. The Collector keeps the slot's figures (lag, retained WAL,
// buffered events, blocked lanes); register both.
//
// Outside the standard library it pulls in the Prometheus client, besides what
// package cdc pulls in (pgx, pglogrepl, the OpenTelemetry trace API).
package cdcprom

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox/cdc"
	"github.com/pgoutbox/pgoutbox/internal/promreg"
)

// Metrics counts a CDC source's publishes. It implements cdc.Observer and is
// safe for concurrent use. pgoutbox_cdc_confirmed_lsn is one gauge: give each
// source of a process its own registry, or read it for one source only.
type Metrics struct {
	outcomes              *promreg.Outcomes
	settle                prometheus.Histogram
	ackSeconds, batchSize *prometheus.HistogramVec
	confirmed, held       prometheus.Gauge
	failoverReady         *prometheus.GaugeVec
}

// New creates the collectors and registers them on reg, which is required: pass
// prometheus.DefaultRegisterer explicitly to use the global registry. Collectors
// already registered on reg (by an earlier New) are reused.
func New(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		return nil, errors.New("cdcprom: New needs a prometheus.Registerer")
	}
	r := &promreg.Registrar{Reg: reg, Subsystem: "cdc"}
	m := &Metrics{
		outcomes: promreg.NewOutcomes(r, "publish_failures_by_reason_total",
			"Failed publish attempts by reason: permanent (quarantined at once), unavailable (broker unreachable or refusing the configuration; retried, never quarantined) or error (quarantined after max attempts)."),
		settle: r.Histogram("settle_seconds",
			"Time to record a batch's outcomes (marks, failures) in the database.", promreg.DatabaseBuckets),
		ackSeconds: r.HistogramVec("broker_ack_seconds",
			"Time from publishing a batch until the broker answered for every message of it, by path (stream or table).", promreg.AckBuckets, "path"),
		batchSize: r.HistogramVec("batch_size",
			"Events handed to the broker per batch, by path (stream or table).", promreg.BatchBuckets, "path"),
		confirmed: r.Gauge("confirmed_lsn", "The slot position last confirmed to the server, as a byte offset in the WAL."),
		held: r.Gauge("standby_held_transactions",
			"Transactions decoded from the slot and held, not published, until the synchronous standbys have them (cdc.StandbyWait)."),
	}
	if r.Err != nil {
		return nil, fmt.Errorf("cdcprom: %w", r.Err)
	}
	// A vector: absent until the first look (never on servers older than 17).
	m.failoverReady = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "pgoutbox", Subsystem: "cdc", Name: "failover_slot_ready",
		Help: "PostgreSQL 17 and later: 1 when a standby synchronises the failover slot (synchronized_standby_slots names an active physical slot and, with a standby URL, its copy of the slot is sync-ready: usable after a promotion), else 0 (cdc.FailoverReadiness). Absent on older servers."},
		[]string{"slot"})
	if err := reg.Register(m.failoverReady); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, fmt.Errorf("cdcprom: %w", err)
		}
		existing, ok := are.ExistingCollector.(*prometheus.GaugeVec)
		if !ok {
			return nil, fmt.Errorf("cdcprom: %w", err)
		}
		m.failoverReady = existing
	}
	for _, p := range []cdc.Path{cdc.PathStream, cdc.PathTable} {
		m.ackSeconds.WithLabelValues(p.String())
		m.batchSize.WithLabelValues(p.String())
	}
	return m, nil
}

// BatchSettled implements cdc.Observer.
func (m *Metrics) BatchSettled(b cdc.SettledBatch) {
	path := b.Path.String()
	m.ackSeconds.WithLabelValues(path).Observe(b.PublishDuration.Seconds())
	m.batchSize.WithLabelValues(path).Observe(float64(len(b.Events)))
	m.settle.Observe(b.SettleDuration.Seconds())
	m.outcomes.Settled(b.Events)
}

// PositionConfirmed implements cdc.Observer.
func (m *Metrics) PositionConfirmed(p cdc.Position) {
	m.confirmed.Set(float64(p.LSN))
}

// StandbyChecked implements cdc.Observer.
func (m *Metrics) StandbyChecked(w cdc.StandbyWait) {
	m.held.Set(float64(w.HeldTransactions))
}

// FailoverChecked implements cdc.Observer.
func (m *Metrics) FailoverChecked(r cdc.FailoverReadiness) {
	v := 0.0
	if r.Ready {
		v = 1
	}
	m.failoverReady.WithLabelValues(r.Slot).Set(v)
}

var _ cdc.Observer = (*Metrics)(nil)
