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
//
// path is "stream" (events from the replication slot) or "table" (lanes the
// table path owns after a failure or a backfill). The names mirror
// relayprom's with the pgoutbox_cdc_ prefix; the failures counter is
// ..._by_reason_total because (*cdc.Source).Collector already exports an
// unlabelled pgoutbox_cdc_publish_failures_total, and both are registered on
// one registry. The Collector keeps the slot's figures (lag, retained WAL,
// buffered events, blocked lanes); register both.
//
// Imports the Prometheus client beyond package cdc.
package cdcprom

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox/cdc"
)

const (
	namespace = "pgoutbox"
	subsystem = "cdc"
)

// Metrics counts a CDC source's publishes. It implements cdc.Observer and is
// safe for concurrent use. pgoutbox_cdc_confirmed_lsn is one gauge: give each
// source of a process its own registry, or read it for one source only.
type Metrics struct {
	published, quarantined prometheus.Counter
	failures               *prometheus.CounterVec
	failuresBy             map[cdc.FailureReason]prometheus.Counter
	attempts, settle       prometheus.Histogram
	ackSeconds, batchSize  *prometheus.HistogramVec
	confirmed              prometheus.Gauge
}

// New creates the collectors and registers them on reg, which is required: pass
// prometheus.DefaultRegisterer explicitly to use the global registry. Collectors
// already registered on reg (by an earlier New) are reused.
func New(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		return nil, errors.New("cdcprom: New needs a prometheus.Registerer")
	}
	m := &Metrics{}
	var err error
	reg1 := func(c prometheus.Collector) prometheus.Collector {
		if err != nil {
			return nil
		}
		var got prometheus.Collector
		got, err = register(reg, c)
		return got
	}
	counter := func(name, help string) prometheus.Counter {
		c, _ := reg1(prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help})).(prometheus.Counter)
		return c
	}
	histogram := func(name, help string, buckets []float64) prometheus.Histogram {
		h, _ := reg1(prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: name, Help: help, Buckets: buckets})).(prometheus.Histogram)
		return h
	}
	histogramVec := func(name, help string, buckets []float64) *prometheus.HistogramVec {
		h, _ := reg1(prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: name, Help: help, Buckets: buckets}, []string{"path"})).(*prometheus.HistogramVec)
		return h
	}
	m.published = counter("published_total", "Events acknowledged by the broker and marked published.")
	m.quarantined = counter("quarantined_total", "Events quarantined: a permanent broker refusal, or max attempts reached.")
	m.attempts = histogram("publish_attempts", "Attempt number at which events were published (1 = first try).",
		[]float64{1, 2, 3, 5, 10, 20, 50})
	m.settle = histogram("settle_seconds", "Time to record a batch's outcomes (marks, failures) in the database.",
		[]float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5})
	m.ackSeconds = histogramVec("broker_ack_seconds", "Time from publishing a batch until the broker answered for every message of it, by path (stream or table).",
		[]float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30})
	m.batchSize = histogramVec("batch_size", "Events handed to the broker per batch, by path (stream or table).",
		[]float64{1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000})
	g, _ := reg1(prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Subsystem: subsystem, Name: "confirmed_lsn",
		Help: "The slot position last confirmed to the server, as a byte offset in the WAL."})).(prometheus.Gauge)
	m.confirmed = g
	f, _ := reg1(prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: "publish_failures_by_reason_total",
		Help: "Failed publish attempts by reason: permanent (quarantined at once), unavailable (broker unreachable or refusing the configuration; retried, never quarantined) or error (quarantined after max attempts).",
	}, []string{"reason"})).(*prometheus.CounterVec)
	m.failures = f
	if err != nil {
		return nil, err
	}
	m.failuresBy = map[cdc.FailureReason]prometheus.Counter{}
	for _, r := range []cdc.FailureReason{cdc.ReasonPermanent, cdc.ReasonUnavailable, cdc.ReasonError} {
		// Created up front so that rate() sees 0 before the first failure.
		m.failuresBy[r] = m.failures.WithLabelValues(string(r))
	}
	for _, p := range []cdc.Path{cdc.PathStream, cdc.PathTable} {
		m.ackSeconds.WithLabelValues(p.String())
		m.batchSize.WithLabelValues(p.String())
	}
	return m, nil
}

// register registers c on reg, or returns the collector of the same description
// that reg already has.
func register(reg prometheus.Registerer, c prometheus.Collector) (prometheus.Collector, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			return are.ExistingCollector, nil
		}
		return nil, fmt.Errorf("cdcprom: register: %w", err)
	}
	return c, nil
}

// BatchSettled implements cdc.Observer.
func (m *Metrics) BatchSettled(b cdc.SettledBatch) {
	path := b.Path.String()
	m.ackSeconds.WithLabelValues(path).Observe(b.PublishDuration.Seconds())
	m.batchSize.WithLabelValues(path).Observe(float64(len(b.Events)))
	m.settle.Observe(b.SettleDuration.Seconds())
	published := 0
	for i := range b.Events {
		o := &b.Events[i]
		switch o.Result {
		case cdc.ResultPublished:
			published++
			m.attempts.Observe(float64(o.Attempt))
		case cdc.ResultFailed, cdc.ResultQuarantined:
			if c, ok := m.failuresBy[o.Reason]; ok {
				c.Inc()
			} else {
				m.failures.WithLabelValues(string(o.Reason)).Inc()
			}
			if o.Result == cdc.ResultQuarantined {
				m.quarantined.Inc()
			}
		}
	}
	if published > 0 {
		m.published.Add(float64(published))
	}
}

// PositionConfirmed implements cdc.Observer.
func (m *Metrics) PositionConfirmed(p cdc.Position) {
	m.confirmed.Set(float64(p.LSN))
}

var _ cdc.Observer = (*Metrics)(nil)
