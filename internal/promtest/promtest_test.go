package promtest_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox/internal/promtest"
)

func TestFindAndValue(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total"}, []string{"reason"})
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h_seconds"})
	reg.MustRegister(c, h)
	c.WithLabelValues("a").Add(2)
	c.WithLabelValues("b").Add(5)
	h.Observe(1)
	if v, ok := promtest.Value(t, reg, "c_total", "reason", "b"); !ok || v != 5 {
		t.Fatalf("c_total{reason=b} = %v, %v; want 5, true", v, ok)
	}
	if v, ok := promtest.Value(t, reg, "h_seconds"); !ok || v != 1 {
		t.Fatalf("h_seconds count = %v, %v; want 1, true", v, ok)
	}
	if _, ok := promtest.Value(t, reg, "c_total", "reason", "zzz"); ok {
		t.Fatal("a label value nobody set was found")
	}
	if promtest.Find(t, reg, "missing") != nil {
		t.Fatal("a missing metric was found")
	}
}
