package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/pubsub"
	"github.com/pgoutbox/pgoutbox/broker/pubsub/pubsubtest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// TestRelayPubSubSIGKILL: the binary relays to a pstest fake (gRPC on
// 127.0.0.1) through a proxy. After a first event is through (the gRPC
// connection is up), the proxy stops forwarding the fake's answers, so the
// next messages are stored but unacknowledged; the relay is SIGKILLed holding
// leases, and a second relay, connected directly, publishes everything. Read
// back, every event is there, each aggregate's first appearances are in order
// and its ordering key is the aggregate; duplicates (the re-published
// unacknowledged messages) are allowed and counted.
func TestRelayPubSubSIGKILL(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 8)
	e := &relayEnv{t: t, pool: pool, dbURL: pgtest.URL(), schema: schema}
	srv := pubsubtest.Start(t)
	topic := srv.CreateTopic(t, "outbox")
	proxy := newAckHoldingProxy(t, srv.Addr)
	start := func(id, endpoint string, extra ...string) *relayProc {
		args := append([]string{"relay", "--database-url", pgtest.URL(), "--schema", schema, "--id", id,
			"--broker", "pubsub://" + pubsubtest.Project + "/" + topic + "?endpoint=" + endpoint}, extra...)
		return startRelayProc(t, "relay "+id, nil, args)
	}

	victim := start("victim", proxy.addr(), "--lease", "2s", "--publish-timeout", "1500ms", "--ack-timeout", "10s")
	ids := e.enqueue(1, 1)
	wait.For(t, 60*time.Second, "the first event to be published", func() bool { return e.count("published_at IS NULL") == 0 })
	proxy.holdAcks()
	ids = append(ids, e.enqueue(20, 4)...)
	wait.For(t, 30*time.Second, "the victim to hold leases", func() bool {
		return e.count("claimed_by = 'victim' AND claim_until > now() AND published_at IS NULL") > 0
	})
	victim.kill(t)

	successor := start("successor", srv.Addr)
	wait.Forf(t, 60*time.Second, func() string { return "the successor to publish everything; its log:\n" + successor.stderr.String() },
		func() bool { return e.count("published_at IS NULL") == 0 })

	stored := srv.Read(topic)
	got := make([]broker.Message, 0, len(stored))
	for _, s := range stored {
		m, err := pubsub.ParseMessage(s.Body, s.Headers)
		pgtest.Must(t, err, "decode a message")
		if key := pubsub.OrderingKey(&m); s.Key != key {
			t.Errorf("event %s: ordering key %q, want %q", m.EventID, s.Key, key)
		}
		got = append(got, m)
	}
	dups := brokertest.CheckStream(t, got, ids)
	t.Logf("%d messages for %d events: %d duplicates from the killed relay's unacknowledged messages", len(got), len(ids), dups)
}

// TestRelayPubSubFlagErrors: a Pub/Sub target that cannot work fails at
// start-up with one line, never echoing credentials put in the URL.
func TestRelayPubSubFlagErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--broker", "pubsub://key:hunter2@proj/outbox"}, "must not hold credentials"},
		{[]string{"--broker", "pubsub://proj/outbox?token=hunter2"}, "unknown query parameter"},
		{[]string{"--broker", "pubsub://proj/outbox", "--topic-template", "o-{aggregate_type}"}, "give one"},
		{[]string{"--broker", "pubsub://proj", "--topic-template", "goog-{aggregate_type}"}, "goog"},
		{[]string{"--broker", "pubsub://proj/outbox?endpoint=localhost"}, "host:port"},
	}
	for _, tc := range cases {
		_, errOut, code := run(t, append([]string{"relay", "--database-url", "postgres://x@127.0.0.1:1/db"}, tc.args...)...)
		if code != 2 || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 || strings.Contains(errOut, "hunter2") {
			t.Errorf("relay %v: exit %d, stderr %q, want one line with %q", tc.args, code, errOut, tc.want)
		}
	}
}

// TestPubSubDescribe: describe names the project, topic and emulator,
// --tenants gets the tenant default topic, and a template may sit in the URL.
func TestPubSubDescribe(t *testing.T) {
	t.Parallel()
	tgt, err := (&brokerFlags{url: "pubsub://proj?endpoint=127.0.0.1:8085", format: "outbox", ackTimeout: time.Second}).parse()
	pgtest.Must(t, err, "parse")
	if d := tgt.describe(); d != "Google Cloud Pub/Sub project proj, topic outbox.{aggregate_type}, emulator 127.0.0.1:8085" {
		t.Errorf("describe: %q", d)
	}
	pgtest.Must(t, tgt.forTenants(), "forTenants")
	if !tgt.template.Uses("tenant") {
		t.Errorf("tenant template %q", tgt.template.String())
	}
	// A template in the URL's path (net/url takes braces there).
	tgt, err = (&brokerFlags{url: "pubsub://proj/o.{tenant}.{aggregate_type}", format: "outbox", ackTimeout: time.Second}).parse()
	pgtest.Must(t, err, "parse a template in the path")
	if tgt.template.String() != "o.{tenant}.{aggregate_type}" || tgt.forTenants() != nil {
		t.Errorf("template %q from the URL's path", tgt.template.String())
	}
}
