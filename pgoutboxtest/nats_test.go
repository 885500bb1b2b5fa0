package pgoutboxtest_test

import (
	"context"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/nats"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/pgoutboxtest"
)

// A test against a real broker: the relay publishes to JetStream, and the record
// holds what the server acknowledged, which the stream then holds too.
func TestRealPublisher(t *testing.T) {
	t.Parallel()
	pool, schema, prod := setup(t)
	target := natstest.New(t, natstest.URL())
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	pub, err := nats.New(ctx, target.JS, &nats.Config{Stream: target.Stream, StreamSubjects: target.Subjects(),
		Subject: broker.MustParseTemplate(target.Template)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	r := pgoutboxtest.New(t, pool, &pgoutboxtest.Config{Schema: schema, Publisher: pub})

	res := enqueue(t, pool, prod, event("order", "1", "order.placed"), event("order", "1", "order.paid"))
	if err := r.WaitDrained(ctx); err != nil {
		t.Fatal(err)
	}
	got, stored := r.PublishedFor("order", "1"), target.Read(t)
	if len(got) != 2 || len(stored) != 2 {
		t.Fatalf("recorded %v, the stream holds %v; want both events", types(got), types(stored))
	}
	for i := range res {
		if got[i].EventID != res[i].EventID || stored[i].EventID != res[i].EventID {
			t.Errorf("event %d: recorded %s, stored %s, enqueued %s", i, got[i].EventID, stored[i].EventID, res[i].EventID)
		}
	}
}
