package cli

import (
	"testing"
	"time"

	cejs "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	natsgo "github.com/nats-io/nats.go"

	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/cetest"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// A relay process with --format cloudevents publishes every event, each
// aggregate in order, as CloudEvents that the CloudEvents Go SDK decodes, with
// the source derived from the schema.
func TestRelayCloudEventsFormat(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	ids := e.enqueue(3, 4)
	p := e.startRelay("ce", natstest.URL(), "--format", "cloudevents")
	wait.For(t, time.Minute, "the events to be published", func() bool { return e.count("published_at IS NULL") == 0 })
	p.stopClean(t, "relay")
	msgs := e.target.Read(t) // reads either format
	brokertest.CheckStream(t, msgs, ids)

	s, err := e.target.JS.Stream(t.Context(), e.target.Stream)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := s.GetMsg(t.Context(), 1)
	if err != nil {
		t.Fatalf("get message 1: %v", err)
	}
	ev := cetest.Decode(t, cejs.NewMessage(&natsgo.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}))
	t.Logf("relay --format cloudevents to NATS, SDK decoded: %s", cetest.Check(t, ev, &msgs[0], "/pgoutbox/"+e.schema))
}

// A CDC relay process (relay --source cdc) with --format cloudevents and a
// --ce-source publishes CloudEvents too.
func TestCDCRelayCloudEventsFormat(t *testing.T) {
	t.Parallel()
	e := newCDCRelayEnv(t)
	e.dropCDC()
	const source = "urn:pgoutbox:cdc-test"
	p := e.startCDCRelay(nil, "--format", "cloudevents", "--ce-source", source)
	ids := e.enqueue(3, 4)
	wait.For(t, time.Minute, "the events to be published", func() bool { return e.count("published_at IS NULL") == 0 })
	p.stopClean(t, "cdc relay")
	msgs := e.target.Read(t)
	brokertest.CheckStream(t, msgs, ids)
	s, err := e.target.JS.Stream(t.Context(), e.target.Stream)
	if err != nil {
		t.Fatal(err)
	}
	last, err := s.GetMsg(t.Context(), uint64(len(msgs)))
	if err != nil {
		t.Fatalf("get message %d: %v", len(msgs), err)
	}
	ev := cetest.Decode(t, cejs.NewMessage(&natsgo.Msg{Subject: last.Subject, Header: last.Header, Data: last.Data}))
	t.Logf("relay --source cdc --format cloudevents to NATS, SDK decoded: %s", cetest.Check(t, ev, &msgs[len(msgs)-1], source))
}
