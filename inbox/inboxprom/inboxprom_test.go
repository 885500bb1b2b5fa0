package inboxprom_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/inboxprom"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestMetricsCountOutcomesPerConsumer(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 4)
	reg := prometheus.NewRegistry()
	m, err := inboxprom.New(reg)
	pgtest.Must(t, err, "New")
	again, err := inboxprom.New(reg) // a second consumer's call reuses the collectors
	pgtest.Must(t, err, "New again")

	fail := true
	h := func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
		if ev.AggregateSequence == 9 && fail {
			return errors.New("boom")
		}
		return nil
	}
	mk := func(name string, obs inbox.Observer) *inbox.Consumer[pgx.Tx] {
		c, err := inbox.New(inbox.Pgx(pool), h, &inbox.Config{Name: name, Schema: schema, Observer: obs,
			GapPolicy: inbox.GapReject})
		pgtest.Must(t, err, "inbox.New")
		return c
	}
	billing, mail := mk("billing", m), mk("mail", again)
	msg := func(seq int64) inbox.Delivery {
		return inbox.DeliveryOf(broker.Message{EventID: pgoutbox.NewEventID(), AggregateType: "order", AggregateID: "1",
			AggregateSequence: seq, EventType: "paid", SchemaVersion: 1, OccurredAt: time.Now(), Payload: []byte(`{}`)})
	}
	ctx := context.Background()
	one := msg(1)
	billing.Process(ctx, one)
	billing.Process(ctx, one)
	billing.Process(ctx, msg(3)) // gap
	billing.Process(ctx, inbox.Delivery{Body: []byte(`{}`)})
	mail.Process(ctx, one)
	mail.Process(ctx, msg(2))
	pgtest.Must(t, mail.SetPosition(ctx, "order", "1", 8), "SetPosition")
	mail.Process(ctx, msg(9)) // fails
	mail.Process(ctx, msg(2)) // sequence 2 again, another event id: a duplicate by position only

	for _, c := range []struct {
		name, consumer string
		want           float64
	}{
		{"pgoutbox_inbox_processed_total", "billing", 1},
		{"pgoutbox_inbox_duplicates_total", "billing", 1},
		{"pgoutbox_inbox_gaps_total", "billing", 1},
		{"pgoutbox_inbox_undecodable_total", "billing", 1},
		{"pgoutbox_inbox_processed_total", "mail", 2},
		{"pgoutbox_inbox_handler_failures_total", "mail", 1},
		{"pgoutbox_inbox_duplicates_total", "mail", 1},
		{"pgoutbox_inbox_duplicates_by_position_total", "mail", 1},
	} {
		if got := value(t, reg, c.name, c.consumer); got != c.want {
			t.Errorf("%s{consumer=%q} = %v, want %v", c.name, c.consumer, got, c.want)
		}
	}
	mfs, err := reg.Gather()
	pgtest.Must(t, err, "gather")
	for _, mf := range mfs {
		if mf.GetName() == "pgoutbox_inbox_processing_seconds" {
			if n := len(mf.GetMetric()); n != 2 {
				t.Fatalf("%d processing_seconds series, want one per consumer", n)
			}
			if c := mf.GetMetric()[0].GetHistogram().GetSampleCount(); c == 0 {
				t.Fatal("no processing time observed")
			}
		}
	}
	if _, err := inboxprom.New(nil); err == nil {
		t.Fatal("New(nil) accepted")
	}
}

// value returns the counter name{consumer=consumer} gathered from reg.
func value(t *testing.T, reg *prometheus.Registry, name, consumer string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	pgtest.Must(t, err, "gather")
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "consumer" && l.GetValue() == consumer {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("%s{consumer=%q} not gathered", name, consumer)
	return 0
}
