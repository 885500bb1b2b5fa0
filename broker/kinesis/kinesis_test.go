package kinesis_test

import (
	"bytes"
	"maps"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/kinesis"
	"github.com/pgoutbox/pgoutbox/broker/kinesis/kinesistest"
	"github.com/pgoutbox/pgoutbox/wire"
)

// TestRefusals: a missing stream is a configuration error, an unreachable
// endpoint is unavailable, a stream name the template makes invalid is a
// permanent refusal; none is sent.
func TestRefusals(t *testing.T) {
	t.Parallel()
	srv := kinesistest.Shared(t)
	m := brokertest.Message("order", "1", 1)

	missing := dial(t, srv, kinesistest.UniqueName("missing"), kinesis.DialConfig{}, nil)
	if err := brokertest.Publish(t, missing, m)[0]; !broker.IsMisconfigured(err) {
		t.Errorf("missing stream: %v, want misconfigured", err)
	}

	perType := dial(t, srv, "outbox-{aggregate_type}", kinesis.DialConfig{}, nil)
	bad := brokertest.Message("order type", "1", 1) // a space cannot be in a stream name
	if err := brokertest.Publish(t, perType, bad)[0]; !broker.IsPermanent(err) {
		t.Errorf("invalid stream name: %v, want permanent", err)
	}

	down := kinesistest.Start(t, "")
	if err := down.Stop(); err != nil {
		t.Fatal(err)
	}
	brokertest.CheckUnreachable(t, dial(t, down, "outbox", kinesis.DialConfig{}, nil), m, brokertest.Message("order", "1", 2))
}

// TestRecord checks what a record holds: the partition key (hashed when the
// lane is too long), a non-JSON payload in base64, and the CloudEvents
// structured format read back by the wire codec.
func TestRecord(t *testing.T) {
	t.Parallel()
	srv := kinesistest.Shared(t)
	stream := srv.CreateStream(t, 2)

	long := brokertest.Message("order", strings.Repeat("é", 300), 1)
	binary := brokertest.Message("order", "2", 1)
	binary.ContentType = "application/octet-stream"
	binary.Payload = []byte{0, 1, 2, 0xff}
	ce := brokertest.Message("order", "3", 1)

	publishOne(t, dial(t, srv, stream, kinesis.DialConfig{}, nil), long)
	publishOne(t, dial(t, srv, stream, kinesis.DialConfig{}, nil), binary)
	cfg := kinesis.DialConfig{Config: kinesis.Config{Encoding: wire.Encoding{Format: wire.FormatCloudEvents, CloudEventsSource: "/app"}}}
	publishOne(t, dial(t, srv, stream, cfg, nil), ce)

	got, err := read(t.Context(), srv, stream)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]brokertest.Stored{}
	for _, s := range got {
		id := s.Headers[wire.HeaderEventID]
		if id == "" {
			id = s.Headers["ce-id"]
		}
		byID[id] = s
	}
	if len(byID) != 3 {
		t.Fatalf("read %d distinct records %v, want 3", len(byID), got)
	}

	s := byID[long.EventID.String()]
	if key := kinesis.PartitionKey(&long); s.Key != key || !strings.HasPrefix(key, "sha256:") || utf8.RuneCountInString(key) > kinesis.MaxPartitionKeyChars {
		t.Errorf("long lane: partition key %q, want the hashed %q", s.Key, key)
	}
	if s := byID[binary.EventID.String()]; !bytes.Equal(s.Body, binary.Payload) {
		t.Errorf("binary payload read back as %q", s.Body)
	}

	s = byID[ce.EventID.String()]
	if s.Key != "order/3" {
		t.Errorf("partition key %q, want the lane order/3", s.Key)
	}
	names := slices.Collect(maps.Keys(s.Headers))
	back, err := wire.ParseReceived(s.Body, names, func(n string) string { return s.Headers[n] })
	if err != nil {
		t.Fatalf("CloudEvents record: %v (headers %v)", err, s.Headers)
	}
	if back.EventID != ce.EventID || back.AggregateSequence != 1 || back.Headers["Tenant"] != "acme corp" || !bytes.Equal(back.Payload, ce.Payload) {
		t.Errorf("CloudEvents record read back as %+v", back)
	}
	if s.Headers["ce-source"] != "/app" {
		t.Errorf("source %q, want /app", s.Headers["ce-source"])
	}
}

func TestParseURL(t *testing.T) {
	t.Parallel()
	u, err := kinesis.ParseURL("kinesis://outbox-{aggregate_type}?region=eu-west-1&endpoint=http://127.0.0.1:4567")
	if err != nil || u.Stream.String() != "outbox-{aggregate_type}" || u.Region != "eu-west-1" || u.Endpoint != "http://127.0.0.1:4567" {
		t.Fatalf("ParseURL: %+v, %v", u, err)
	}
	for _, bad := range []string{
		"kinesis://?region=a&region=b&x",
		"sqs://outbox",
		"kinesis://key:hunter2@outbox",
		"kinesis://outbox/path",
		"kinesis://out box",
		"kinesis://outbox-{nope}",
		"kinesis://outbox?secret=hunter2",
		"kinesis://outbox?region=EU WEST",
		"kinesis://outbox?endpoint=http://key:hunter2@host",
		"kinesis://outbox?endpoint=ftp://host",
		"kinesis://outbox?region=a&region=b",
		"kinesis://" + strings.Repeat("a", 129),
		"kinesis://" + strings.Repeat("a", 3000),
	} {
		_, err := kinesis.ParseURL(bad)
		if err == nil {
			t.Errorf("ParseURL(%q) accepted", bad)
		} else if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("ParseURL(%q): the error echoes a secret: %v", bad, err)
		}
	}
}

func FuzzParseURL(f *testing.F) {
	f.Add("kinesis://outbox?region=us-east-1")
	f.Add("kinesis://a-{aggregate_type}.{event_type}?endpoint=https://h/p")
	f.Fuzz(func(t *testing.T, s string) {
		u, err := kinesis.ParseURL(s)
		if err != nil {
			return
		}
		m := brokertest.Message("order", "1", 1)
		if name, err := u.Stream.ExpandChecked(&m); err == nil && kinesis.CheckStreamName(name) != nil && !u.Stream.Uses("aggregate_type") &&
			!u.Stream.Uses("event_type") && !u.Stream.Uses("aggregate_id") && !u.Stream.Uses("tenant") && !u.Stream.Uses("schema_version") {
			t.Errorf("ParseURL(%q) accepted a stream %q Kinesis refuses", s, name)
		}
	})
}
