package sqs_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/aws/sqs"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/logtest"
	"github.com/pgoutbox/pgoutbox/wire"
)

// publisher opens a Publisher to the queue url with cfg (nil: defaults).
func publisher(t *testing.T, url string, cfg *sqs.Config) *sqs.Publisher {
	t.Helper()
	if cfg == nil {
		cfg = &sqs.Config{}
	}
	cfg.Destination = broker.MustParseTemplate(url)
	p, err := sqs.New(t.Context(), sqsClient(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

func TestStandardRefusedUnlessAllowed(t *testing.T) {
	t.Parallel()
	_, queue := newQueue(t, true)
	topic := newTopic(t, true)
	open := map[string]func(cfg *sqs.Config) (*sqs.Publisher, error){
		"SQS": func(cfg *sqs.Config) (*sqs.Publisher, error) {
			cfg.Destination = broker.MustParseTemplate(queue)
			return sqs.New(t.Context(), sqsClient(), cfg)
		},
		"SNS": func(cfg *sqs.Config) (*sqs.Publisher, error) {
			cfg.Destination = broker.MustParseTemplate(topic)
			return sqs.NewSNS(t.Context(), snsClient(), cfg)
		},
	}
	for name, open := range open {
		t.Run(name, func(t *testing.T) {
			if _, err := open(&sqs.Config{}); !broker.IsMisconfigured(err) || !strings.Contains(err.Error(), "not FIFO") {
				t.Fatalf("standard destination: %v, want a misconfiguration saying it is not FIFO", err)
			}
			var logs logtest.Buffer
			p, err := open(&sqs.Config{AllowStandard: true, Logger: logs.Logger()})
			if err != nil {
				t.Fatalf("AllowStandard: %v", err)
			}
			if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "order") {
				t.Errorf("no WARN about order: %s", logs.String())
			}
			if err := brokertest.Publish(t, p, brokertest.Message("order", "1", 1))[0]; err != nil {
				t.Errorf("Publish: %v", err)
			}
		})
	}
}

func TestMissingDestinationIsMisconfigured(t *testing.T) {
	t.Parallel()
	_, err := sqs.New(t.Context(), sqsClient(), &sqs.Config{Destination: broker.MustParseTemplate(unique("missing") + ".fifo")})
	if !broker.IsMisconfigured(err) {
		t.Errorf("New to a missing queue: %v, want misconfigured", err)
	}
	// With placeholders, the queue is looked up at its first event.
	p, err := sqs.New(t.Context(), sqsClient(), &sqs.Config{Destination: broker.MustParseTemplate(unique("missing") + "-{aggregate_type}.fifo")})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	res := brokertest.Publish(t, p, brokertest.Message("order", "1", 1), brokertest.Message("order", "1", 2))
	if !broker.IsMisconfigured(res[0]) || !errors.Is(res[1], broker.ErrPredecessorFailed) {
		t.Errorf("results %v, want misconfigured then ErrPredecessorFailed", res)
	}
	// No answer at all is unavailable, never a refusal.
	cfg := awsConfig()
	cfg.BaseEndpoint = aws.String("http://127.0.0.1:" + strconv.Itoa(brokertest.FreePort(t)))
	cfg.RetryMaxAttempts = 1
	p, err = sqs.New(t.Context(), awssqs.NewFromConfig(cfg), &sqs.Config{Destination: broker.MustParseTemplate("q-{aggregate_type}.fifo")})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	brokertest.CheckUnreachable(t, p, brokertest.Message("order", "1", 1), brokertest.Message("order", "1", 2), brokertest.Message("user", "2", 1))
}

func TestLimitsRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	_, url := newQueue(t, false)
	p := publisher(t, url, nil)
	big := brokertest.Message("order", "1", 1)
	big.Payload = []byte(`"` + strings.Repeat("x", sqs.MaxMessageBytes) + `"`)
	binary := brokertest.Message("order", "2", 1)
	binary.Payload, binary.ContentType = []byte{0xff, 0x00}, "application/octet-stream"
	res := brokertest.Publish(t, p, big, brokertest.Message("order", "1", 2), binary, brokertest.Message("order", "3", 1))
	if !broker.IsPermanent(res[0]) || !strings.Contains(res[0].Error(), "above the 262144") {
		t.Errorf("too large: %v, want permanent naming the limit", res[0])
	}
	if !errors.Is(res[1], broker.ErrPredecessorFailed) {
		t.Errorf("after too large: %v, want ErrPredecessorFailed", res[1])
	}
	if !broker.IsPermanent(res[2]) {
		t.Errorf("binary body: %v, want permanent", res[2])
	}
	if res[3] != nil {
		t.Errorf("other aggregate: %v", res[3])
	}
}

func TestMessageGroupID(t *testing.T) {
	t.Parallel()
	_, url := newQueue(t, false)
	p := publisher(t, url, nil)
	long := strings.Repeat("x", 200)
	msgs := []broker.Message{brokertest.Message("order", "42", 1), brokertest.Message("order", long, 1), brokertest.Message("order", "caf\u00e9 1", 1), brokertest.Message("a:b", "c", 1)}
	for i, err := range brokertest.Publish(t, p, msgs...) {
		if err != nil {
			t.Fatalf("Publish %d: %v", i, err)
		}
	}
	got, err := (&reader{url: url}).read(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string]string{}
	for _, s := range got {
		groups[s.Headers[wire.HeaderAggregateID]] = s.Key
	}
	if g := groups["42"]; g != "order:42" {
		t.Errorf("group of a short lane = %q, want order:42", g)
	}
	for _, id := range []string{long, "caf\u00e9 1", "c"} {
		if g := groups[id]; len(g) != 65 || g[0] != '~' {
			t.Errorf("group of aggregate %.20q = %q, want ~ and a SHA-256", id, g)
		}
	}
}

func TestCloudEventsStructured(t *testing.T) {
	t.Parallel()
	_, url := newQueue(t, false)
	p := publisher(t, url, &sqs.Config{Encoding: wire.Encoding{Format: wire.FormatCloudEvents, CloudEventsSource: "/test"}})
	spoofed := brokertest.Message("order", "2", 1)
	spoofed.Headers["ce-id"] = "spoofed"
	m := brokertest.Message("order", "1", 7)
	res := brokertest.Publish(t, p, spoofed, m)
	if !broker.IsPermanent(res[0]) {
		t.Errorf("a producer header ce-id: %v, want a permanent refusal", res[0])
	}
	if err := res[1]; err != nil {
		t.Fatalf("Publish: %v", err)
	}
	got, err := (&reader{url: url}).read(t.Context())
	if err != nil || len(got) != 1 {
		t.Fatalf("read %d messages: %v", len(got), err)
	}
	var ev map[string]json.RawMessage
	if err := json.Unmarshal(got[0].Body, &ev); err != nil {
		t.Fatalf("body is not JSON: %v", err)
	}
	want := map[string]string{"specversion": `"1.0"`, "id": `"` + m.EventID.String() + `"`, "source": `"/test"`, "type": `"created"`,
		"pgoutboxseq": `"7"`, "pgoutboxaggid": `"1"`, "datacontenttype": `"application/json"`, "data": string(m.Payload)}
	for k, v := range want {
		if string(ev[k]) != v {
			t.Errorf("%s = %s, want %s", k, ev[k], v)
		}
	}
	if ct := got[0].Headers[sqs.ContentTypeAttribute]; ct != "application/cloudevents+json" {
		t.Errorf("Content-Type attribute = %q", ct)
	}
	if tp := got[0].Headers[wire.HeaderTraceParent]; tp != m.Headers[wire.HeaderTraceParent] {
		t.Errorf("traceparent = %q", tp)
	}
}

func TestHeadersRefusesMalformed(t *testing.T) {
	t.Parallel()
	if _, err := sqs.Headers(map[string]string{sqs.HeadersAttribute: "[1]"}); err == nil {
		t.Error("a malformed Outbox-Headers attribute was accepted")
	}
	h, err := sqs.Headers(map[string]string{sqs.HeadersAttribute: `{"a":"b","Outbox-Event-Id":"spoof"}`, wire.HeaderEventID: "real"})
	if err != nil || h["a"] != "b" || h[wire.HeaderEventID] != "real" {
		t.Errorf("Headers = %v, %v", h, err)
	}
}

func TestPing(t *testing.T) {
	t.Parallel()
	_, url := newQueue(t, false)
	if err := publisher(t, url, nil).Ping(context.Background()); err != nil {
		t.Errorf("Ping: %v", err)
	}
}

func TestInvalidDestinationIsPermanent(t *testing.T) {
	t.Parallel()
	p, err := sqs.New(t.Context(), sqsClient(), &sqs.Config{Destination: broker.MustParseTemplate("outbox-{aggregate_type}.fifo")})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	res := brokertest.Publish(t, p, brokertest.Message("order.item", "1", 1))
	if !broker.IsPermanent(res[0]) || !strings.Contains(res[0].Error(), "queue name") {
		t.Errorf("aggregate type with a dot: %v, want permanent naming the queue name rule", res[0])
	}
	if _, err := sqs.NewSNS(t.Context(), snsClient(), &sqs.Config{Destination: broker.MustParseTemplate("topic-name")}); err == nil || !strings.Contains(err.Error(), "want a topic ARN") {
		t.Error("NewSNS accepted a topic name that is not an ARN")
	}
}
