package pubsub_test

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/pubsub"
	"github.com/pgoutbox/pgoutbox/broker/pubsub/pubsubtest"
	"github.com/pgoutbox/pgoutbox/wire"
)

// failFirst fails the first Publish request with code and lets the rest
// through.
type failFirst struct {
	code  codes.Code
	calls atomic.Int32
}

func (f *failFirst) React(any) (bool, any, error) {
	if f.calls.Add(1) == 1 {
		return true, nil, status.Error(f.code, "injected")
	}
	return false, nil, nil
}

// TestFailedKeyResumed: a refused publish pauses the ordering key in the
// client; the rest of the aggregate is not sent (ErrPredecessorFailed), and
// the next batch, the relay's retry, goes through in order.
func TestFailedKeyResumed(t *testing.T) {
	t.Parallel()
	srv := pubsubtest.Start(t, pstest.ServerReactorOption{FuncName: "Publish", Reactor: &failFirst{code: codes.InvalidArgument}})
	topic := srv.CreateTopic(t, "outbox")
	pub := dial(t, srv.URL(topic), pubsub.Config{})
	msgs := []broker.Message{brokertest.Message("order", "1", 1), brokertest.Message("order", "1", 2), brokertest.Message("order", "1", 3)}

	first := brokertest.Publish(t, pub, msgs...)
	if !broker.IsPermanent(first[0]) || !errors.Is(first[1], broker.ErrPredecessorFailed) || !errors.Is(first[2], broker.ErrPredecessorFailed) {
		t.Fatalf("first batch: %v; want a permanent refusal, then ErrPredecessorFailed twice", first)
	}
	for i, err := range brokertest.Publish(t, pub, msgs...) {
		if err != nil {
			t.Fatalf("retry: result %d: %v (the ordering key was not resumed)", i, err)
		}
	}
	got := srv.Read(topic)
	if len(got) != 3 {
		t.Fatalf("stored %d messages, want 3", len(got))
	}
	for i, s := range got {
		if s.Headers[wire.HeaderAggregateSequence] != []string{"1", "2", "3"}[i] || s.Key != "order/1" {
			t.Errorf("message %d: sequence %s, key %q", i, s.Headers[wire.HeaderAggregateSequence], s.Key)
		}
	}
}

// TestRefusedBeforePublishing: what Pub/Sub would refuse is refused
// permanently, naming the reason, and never sent.
func TestRefusedBeforePublishing(t *testing.T) {
	t.Parallel()
	srv := pubsubtest.Start(t)
	topic := srv.CreateTopic(t, "outbox")
	tmpl, err := broker.ParseTemplate(topic + "{aggregate_id}")
	if err != nil {
		t.Fatal(err)
	}
	pub := dial(t, srv.URL(""), pubsub.Config{Topic: tmpl})
	for _, tc := range []struct {
		change func(m *broker.Message)
		want   string
	}{
		{func(m *broker.Message) { m.Headers = map[string]string{"Big": strings.Repeat("x", 1025)} }, "above Pub/Sub's limit of 1024"},
		{func(m *broker.Message) { m.Headers = map[string]string{"goog-x": "1"} }, `reserves keys starting with "goog"`},
		{func(m *broker.Message) { m.Payload = make([]byte, pubsub.MaxMessageBytes) }, "above Pub/Sub's limit of 10000000"},
		{func(m *broker.Message) { m.AggregateID = "a b" }, "not allowed"},
		{func(m *broker.Message) { m.AggregateID = strings.Repeat("a", 250) }, "want 3 to 255"},
	} {
		m := brokertest.Message("order", "-1", 1)
		tc.change(&m)
		err := brokertest.Publish(t, pub, m)[0]
		if !broker.IsPermanent(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want a permanent refusal saying %q", err, tc.want)
		}
	}
	if n := len(srv.Messages()); n != 0 {
		t.Errorf("%d messages sent", n)
	}
	// A missing topic is the configuration's fault: retried, never quarantined.
	err = brokertest.Publish(t, pub, brokertest.Message("order", "-missing", 1))[0]
	if !broker.IsMisconfigured(err) {
		t.Errorf("missing topic: %v, want Misconfigured", err)
	}
}

// TestCloudEvents: the CloudEvents Pub/Sub binding in binary mode, read back
// by ParseMessage; a lane above 1024 bytes becomes a hashed ordering key.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	srv := pubsubtest.Start(t)
	topic := srv.CreateTopic(t, "outbox")
	pub := dial(t, srv.URL(topic), pubsub.Config{Encoding: wire.Encoding{Format: wire.FormatCloudEvents, CloudEventsSource: "/app"}})
	m := brokertest.Message("order", "7", 1)
	m.Headers = map[string]string{"Tenant": "acme corp"}
	if err := brokertest.Publish(t, pub, m)[0]; err != nil {
		t.Fatal(err)
	}
	s := srv.Read(topic)[0]
	if s.Headers["ce-source"] != "/app" || s.Headers["ce-specversion"] != "1.0" || s.Headers[pubsub.ContentTypeAttribute] != "application/json" {
		t.Errorf("attributes %v", s.Headers)
	}
	if s.Key != "order/7" {
		t.Errorf("ordering key %q, want order/7", s.Key)
	}
	long := brokertest.Message("order", strings.Repeat("7", 1020), 1)
	if key := pubsub.OrderingKey(&long); len(key) != len("sha256:")+64 || !strings.HasPrefix(key, "sha256:") {
		t.Errorf("ordering key of a lane above 1024 bytes: %q, want a hash", key)
	}
	back, err := pubsub.ParseMessage(s.Body, s.Headers)
	if err != nil || back.EventID != m.EventID || back.AggregateID != m.AggregateID || back.Headers["Tenant"] != "acme corp" {
		t.Errorf("read back as %+v, %v", back, err)
	}
}

func TestParseURL(t *testing.T) {
	t.Parallel()
	u, err := pubsub.ParseURL("pubsub://my-project/outbox.{aggregate_type}?endpoint=127.0.0.1:8085")
	if err != nil || u.Project != "my-project" || u.Topic.String() != "outbox.{aggregate_type}" || u.Endpoint != "127.0.0.1:8085" {
		t.Fatalf("ParseURL: %+v, %v", u, err)
	}
	for _, bad := range []string{
		"pubsub://",
		"kafka://p/t",
		"pubsub://key:hunter2@p/t",
		"pubsub://p/t/more",
		"pubsub://p/t#x",
		"pubsub://P_ROJECT/t",
		"pubsub://p/goog-t",
		"pubsub://p/1topic",
		"pubsub://p/t-{nope}",
		"pubsub://p/t?token=hunter2",
		"pubsub://p/t?endpoint=http://key:hunter2@host:1",
		"pubsub://p/t?endpoint=host",
		"pubsub://p/t?endpoint=a:1&endpoint=b:1",
		"pubsub://p/" + strings.Repeat("a", 256),
		"pubsub://p/" + strings.Repeat("a", 3000),
	} {
		_, err := pubsub.ParseURL(bad)
		if err == nil {
			t.Errorf("ParseURL(%q) accepted", bad)
		} else if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("ParseURL(%q): the error echoes a secret: %v", bad, err)
		}
	}
}

func FuzzParseURL(f *testing.F) {
	f.Add("pubsub://p/outbox?endpoint=localhost:8085")
	f.Add("pubsub://example.com:p/a-{aggregate_type}.{event_type}")
	f.Fuzz(func(t *testing.T, s string) {
		u, err := pubsub.ParseURL(s)
		if err != nil || u.Topic.String() == "" {
			return
		}
		if !strings.Contains(u.Topic.String(), "{") {
			m := brokertest.Message("order", "1", 1)
			if name, err := u.Topic.ExpandChecked(&m); err == nil && pubsub.CheckTopicID(name) != nil {
				t.Errorf("ParseURL(%q) accepted a topic %q Pub/Sub refuses", s, name)
			}
		}
	})
}
