// Package inboxprom exports an inbox consumer's outcomes as Prometheus metrics.
//
// One *Metrics serves every consumer of a process: set it as inbox.Config.Observer
// of each, and the consumer label tells them apart.
//
//	pgoutbox_inbox_processed_total{consumer}          events applied
//	pgoutbox_inbox_duplicates_total{consumer}         deliveries found already applied
//	pgoutbox_inbox_duplicates_by_position_total{consumer}  of those, events whose id was never applied (inbox.Outcome.ByPosition)
//	pgoutbox_inbox_gaps_total{consumer}               sequence gaps found (rejected deliveries, or applications over a gap under GapAccept)
//	pgoutbox_inbox_handler_failures_total{consumer}   deliveries rolled back (handler, upcaster or database error)
//	pgoutbox_inbox_undecodable_total{consumer}        deliveries that are not outbox events
//	pgoutbox_inbox_processing_seconds{consumer}       time to process a delivery, whatever its outcome
//
// Outside the standard library it pulls in the Prometheus client, besides what
// package inbox pulls in (pgx, the OpenTelemetry API).
package inboxprom

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/promreg"
)

// Metrics holds the collectors. It implements inbox.Observer.
type Metrics struct {
	processed, duplicates, byPosition, gaps, failures, undecodable *prometheus.CounterVec
	latency                                                        *prometheus.HistogramVec
}

// New creates the collectors and registers them on reg, which is required: pass
// prometheus.DefaultRegisterer explicitly to use the global registry. Collectors
// already registered on reg (by an earlier New) are reused, so calling New once per
// consumer is fine too.
func New(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		return nil, errors.New("inboxprom: New needs a prometheus.Registerer")
	}
	counter := func(name, help string) (*prometheus.CounterVec, error) {
		return promreg.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pgoutbox", Subsystem: "inbox", Name: name, Help: help,
		}, []string{"consumer"}))
	}
	m := &Metrics{}
	var err error
	for _, c := range []struct {
		dst        **prometheus.CounterVec
		name, help string
	}{
		{&m.processed, "processed_total", "Events applied by the consumer (handler ran and committed)."},
		{&m.duplicates, "duplicates_total", "Deliveries of events the consumer had already applied; acknowledged without effect."},
		{&m.byPosition, "duplicates_by_position_total", "Of the duplicates, events whose id the consumer never applied: only the sequence, at or below the position, made them duplicates " +
			"(skipped by an operator, record deleted by retention, or sequence allocated again after an asynchronous failover); not applied."},
		{&m.gaps, "gaps_total", "Sequence gaps found: deliveries rejected for a gap (GapReject), or applied over one (GapAccept)."},
		{&m.failures, "handler_failures_total", "Deliveries rolled back for an error (handler, upcaster or database) and redelivered."},
		{&m.undecodable, "undecodable_total", "Deliveries that are not outbox events, terminated."},
	} {
		if *c.dst, err = counter(c.name, c.help); err != nil {
			return nil, err
		}
	}
	m.latency, err = promreg.Register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "pgoutbox", Subsystem: "inbox", Name: "processing_seconds",
		Help:    "Time to process one delivery (decode, transaction, handler, commit), whatever its outcome.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"consumer"}))
	if err != nil {
		return nil, err
	}
	return m, nil
}

// Observe implements inbox.Observer.
func (m *Metrics) Observe(o inbox.Outcome) {
	switch o.Status {
	case inbox.StatusApplied:
		m.processed.WithLabelValues(o.Consumer).Inc()
		if o.Gap > 0 {
			m.gaps.WithLabelValues(o.Consumer).Inc()
		}
	case inbox.StatusDuplicate:
		m.duplicates.WithLabelValues(o.Consumer).Inc()
		if o.ByPosition {
			m.byPosition.WithLabelValues(o.Consumer).Inc()
		}
	case inbox.StatusGapRejected:
		m.gaps.WithLabelValues(o.Consumer).Inc()
	case inbox.StatusFailed:
		m.failures.WithLabelValues(o.Consumer).Inc()
	case inbox.StatusUndecodable:
		m.undecodable.WithLabelValues(o.Consumer).Inc()
	}
	m.latency.WithLabelValues(o.Consumer).Observe(o.Duration.Seconds())
}

var _ inbox.Observer = (*Metrics)(nil)
