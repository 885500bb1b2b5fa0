// Package promreg is the one way relayprom, cdcprom and inboxprom register their
// collectors, and the one way the relay's and the CDC source's metrics count the
// outcomes of settled events.
package promreg

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/pipeline"
)

// Namespace is the first part of every metric name pgoutbox exports.
const Namespace = "pgoutbox"

// Register registers c on reg, or returns the collector of the same description
// that reg already has (so that New may be called once per relay or consumer of
// a process).
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		var zero C
		return zero, fmt.Errorf("register: %w", err)
	}
	return c, nil
}

// Registrar registers the collectors of one subsystem (pgoutbox_<Subsystem>_…)
// one after another and keeps the first error, so that a constructor can
// declare its collectors in a list and check Err once.
type Registrar struct {
	Reg       prometheus.Registerer
	Subsystem string
	// Err is the first registration error; after it, nothing more is registered
	// and the methods return nil collectors.
	Err error
}

func add[C prometheus.Collector](r *Registrar, c C) C {
	if r.Err != nil {
		var zero C
		return zero
	}
	got, err := Register(r.Reg, c)
	if err != nil {
		r.Err = err
	}
	return got
}

// Counter registers a counter.
func (r *Registrar) Counter(name, help string) prometheus.Counter {
	return add(r, prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Subsystem: r.Subsystem, Name: name, Help: help}))
}

// CounterVec registers a counter with labels.
func (r *Registrar) CounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return add(r, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Subsystem: r.Subsystem, Name: name, Help: help}, labels))
}

// Gauge registers a gauge.
func (r *Registrar) Gauge(name, help string) prometheus.Gauge {
	return add(r, prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Subsystem: r.Subsystem, Name: name, Help: help}))
}

// Histogram registers a histogram with the given buckets.
func (r *Registrar) Histogram(name, help string, buckets []float64) prometheus.Histogram {
	return add(r, prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: r.Subsystem, Name: name, Help: help, Buckets: buckets}))
}

// HistogramVec registers a histogram with labels and the given buckets.
func (r *Registrar) HistogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return add(r, prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Subsystem: r.Subsystem, Name: name, Help: help, Buckets: buckets}, labels))
}

// Buckets shared by the relay's and the CDC source's histograms.
var (
	AttemptBuckets  = []float64{1, 2, 3, 5, 10, 20, 50}
	AckBuckets      = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	BatchBuckets    = []float64{1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000}
	DatabaseBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}
)

// Outcomes counts settled events the same way for the relay and the CDC
// source: published (and at which attempt), failed by reason, quarantined
// (Settled takes a batch's pipeline.EventOutcome list).
type Outcomes struct {
	published, quarantined prometheus.Counter
	attempts               prometheus.Histogram
	failures               *prometheus.CounterVec
	byReason               map[broker.FailureReason]prometheus.Counter
}

// NewOutcomes registers <subsystem>_published_total, _quarantined_total,
// _publish_attempts and the failures counter named failuresName, labelled by
// reason, with every reason created up front so that rate() sees 0 before the
// first failure. It returns nil when r.Err is set.
func NewOutcomes(r *Registrar, failuresName, failuresHelp string) *Outcomes {
	o := &Outcomes{
		published:   r.Counter("published_total", "Events acknowledged by the broker and marked published."),
		quarantined: r.Counter("quarantined_total", "Events quarantined: a permanent broker refusal, or max attempts reached."),
		attempts:    r.Histogram("publish_attempts", "Attempt number at which events were published (1 = first try).", AttemptBuckets),
		failures:    r.CounterVec(failuresName, failuresHelp, "reason"),
	}
	if r.Err != nil {
		return nil
	}
	o.byReason = map[broker.FailureReason]prometheus.Counter{}
	for _, reason := range []broker.FailureReason{broker.ReasonPermanent, broker.ReasonUnavailable, broker.ReasonError} {
		o.byReason[reason] = o.failures.WithLabelValues(string(reason))
	}
	return o
}

// Settled counts the outcomes of a settled batch (the relay's and the CDC
// source's Observer.BatchSettled): each published event and its attempt
// number, each failed attempt by reason, each quarantine. Events not attempted
// (released, held) count nowhere.
func (o *Outcomes) Settled(events []pipeline.EventOutcome) {
	published := 0
	for i := range events {
		e := &events[i]
		switch e.Result {
		case pipeline.ResultPublished:
			published++
			o.attempt(e.Attempt)
		case pipeline.ResultFailed, pipeline.ResultQuarantined:
			o.failed(e.Reason, e.Result == pipeline.ResultQuarantined)
		}
	}
	if published > 0 {
		o.published.Add(float64(published))
	}
}

// attempt records that an event was published at attempt (from 1).
func (o *Outcomes) attempt(attempt int) { o.attempts.Observe(float64(attempt)) }

// failed counts one failed publish attempt for reason, and a quarantine when
// the event was quarantined.
func (o *Outcomes) failed(reason broker.FailureReason, quarantined bool) {
	if c, ok := o.byReason[reason]; ok {
		c.Inc()
	} else {
		o.failures.WithLabelValues(string(reason)).Inc()
	}
	if quarantined {
		o.quarantined.Inc()
	}
}
