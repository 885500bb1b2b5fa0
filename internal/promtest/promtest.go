// Package promtest reads metrics back from a real Prometheus registry in tests:
// the one helper of the relayprom and cdcprom tests.
package promtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Find returns the metric name{labels} gathered from reg, or nil. labels are
// name, value pairs; a metric matches when it has every one of them.
func Find(tb testing.TB, reg prometheus.Gatherer, name string, labels ...string) *dto.Metric {
	tb.Helper()
	families, err := reg.Gather()
	if err != nil {
		tb.Fatalf("promtest: gather: %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					found = found || (l.GetName() == labels[i] && l.GetValue() == labels[i+1])
				}
				if !found {
					continue metrics
				}
			}
			return m
		}
	}
	return nil
}

// Value returns the value of the counter or gauge name{labels}, or the sample
// count of a histogram, and false when there is no such metric.
func Value(tb testing.TB, reg prometheus.Gatherer, name string, labels ...string) (float64, bool) {
	tb.Helper()
	m := Find(tb, reg, name, labels...)
	switch {
	case m == nil:
		return 0, false
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue(), true
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue(), true
	case m.GetHistogram() != nil:
		return float64(m.GetHistogram().GetSampleCount()), true
	}
	return 0, false
}
