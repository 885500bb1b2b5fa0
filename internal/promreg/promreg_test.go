package promreg_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/pipeline"
	"github.com/pgoutbox/pgoutbox/internal/promreg"
	"github.com/pgoutbox/pgoutbox/internal/promtest"
)

func value(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	v, ok := promtest.Value(t, reg, name, labels...)
	if !ok {
		t.Fatalf("no metric %s%v", name, labels)
	}
	return v
}

func TestRegisterReusesTheCollectorAlreadyRegistered(t *testing.T) {
	reg := prometheus.NewRegistry()
	a := &promreg.Registrar{Reg: reg, Subsystem: "x"}
	first := a.Counter("things_total", "Things.")
	b := &promreg.Registrar{Reg: reg, Subsystem: "x"}
	second := b.Counter("things_total", "Things.")
	if a.Err != nil || b.Err != nil {
		t.Fatalf("errors: %v, %v", a.Err, b.Err)
	}
	first.Inc()
	second.Inc()
	if got := value(t, reg, "pgoutbox_x_things_total"); got != 2 {
		t.Fatalf("pgoutbox_x_things_total = %v, want 2: the second registration must reuse the first counter", got)
	}
}

func TestRegistrarKeepsTheFirstError(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := &promreg.Registrar{Reg: reg, Subsystem: "x"}
	r.Counter("things_total", "Things.")
	// The same name as another kind with other help conflicts.
	if g := r.Gauge("things_total", "Other things."); g != nil || r.Err == nil {
		t.Fatalf("conflicting registration: gauge %v, Err %v; want nil and an error", g, r.Err)
	}
	first := r.Err
	if c := r.Counter("more_total", "More."); c != nil || r.Err != first {
		t.Fatalf("after an error: counter %v, Err %v; want nil and the first error", c, r.Err)
	}
}

func TestOutcomesCountEveryReasonFromZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := &promreg.Registrar{Reg: reg, Subsystem: "y"}
	o := promreg.NewOutcomes(r, "publish_failures_total", "Failures.")
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	for _, reason := range []broker.FailureReason{broker.ReasonPermanent, broker.ReasonUnavailable, broker.ReasonError} {
		if got := value(t, reg, "pgoutbox_y_publish_failures_total", "reason", string(reason)); got != 0 {
			t.Fatalf("reason %s starts at %v, want 0", reason, got)
		}
	}
	o.Settled([]pipeline.EventOutcome{
		{Result: pipeline.ResultPublished, Attempt: 1}, {Result: pipeline.ResultPublished, Attempt: 1},
		{Result: pipeline.ResultQuarantined, Attempt: 1, Reason: broker.ReasonPermanent},
		{Result: pipeline.ResultFailed, Attempt: 2, Reason: broker.ReasonError},
		{Result: pipeline.ResultReleased}, {Result: pipeline.ResultHeld},
	})
	o.Settled([]pipeline.EventOutcome{{Result: pipeline.ResultPublished, Attempt: 3}, {Result: pipeline.ResultFailed, Attempt: 1, Reason: "novel"}})
	for name, want := range map[string]float64{"pgoutbox_y_published_total": 3, "pgoutbox_y_quarantined_total": 1} {
		if got := value(t, reg, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	for reason, want := range map[string]float64{"permanent": 1, "error": 1, "unavailable": 0, "novel": 1} {
		if got := value(t, reg, "pgoutbox_y_publish_failures_total", "reason", reason); got != want {
			t.Errorf("failures{reason=%q} = %v, want %v", reason, got, want)
		}
	}
}
