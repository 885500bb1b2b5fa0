package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/kinesis"
	"github.com/pgoutbox/pgoutbox/broker/kinesis/kinesistest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/wire"
)

// TestRelayKinesisSIGKILL: the binary relays to kinesalite through a proxy
// that stops forwarding Kinesis's answers, so the records are stored but
// unacknowledged; it is SIGKILLed holding leases, and a second relay,
// connected directly, publishes everything. Read back, every event is there
// and each aggregate's first appearances are in order; duplicates (the
// re-published unacknowledged records) are allowed and counted.
func TestRelayKinesisSIGKILL(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 8)
	e := &relayEnv{t: t, pool: pool, dbURL: pgtest.URL(), schema: schema}
	srv := kinesistest.Start(t, "")
	stream := srv.CreateStream(t, 2)
	proxy := newAckHoldingProxy(t, strings.TrimPrefix(srv.Endpoint, "http://"))
	start := func(id, endpoint string, extra ...string) *relayProc {
		args := append([]string{"relay", "--database-url", pgtest.URL(), "--schema", schema, "--id", id,
			"--broker", "kinesis://" + stream + "?endpoint=" + endpoint}, extra...)
		return startRelayProc(t, "relay "+id, kinesistest.Env(), args)
	}

	victim := start("victim", "http://"+proxy.addr(), "--lease", "2s", "--publish-timeout", "1500ms", "--ack-timeout", "10s")
	proxy.holdAcks()
	ids := e.enqueue(20, 4)
	wait.For(t, 30*time.Second, "the victim to hold leases", func() bool {
		return e.count("claimed_by = 'victim' AND claim_until > now() AND published_at IS NULL") > 0
	})
	victim.kill(t)

	successor := start("successor", srv.Endpoint)
	wait.Forf(t, 60*time.Second, func() string { return "the successor to publish everything; its log:\n" + successor.stderr.String() },
		func() bool { return e.count("published_at IS NULL") == 0 })

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	records, err := kinesistest.ReadAll(ctx, srv.Client(), stream)
	pgtest.Must(t, err, "read the stream")
	got := make([]broker.Message, 0, len(records))
	for _, r := range records {
		h, body, err := kinesis.ParseRecord(r.Data)
		pgtest.Must(t, err, "parse a record")
		names := make([]string, 0, len(h))
		for k := range h {
			names = append(names, k)
		}
		m, err := wire.ParseReceived(body, names, func(n string) string { return h[n] })
		pgtest.Must(t, err, "decode a record")
		if key := kinesis.PartitionKey(&m); r.PartitionKey != key {
			t.Errorf("event %s: partition key %q, want %q", m.EventID, r.PartitionKey, key)
		}
		got = append(got, m)
	}
	dups := brokertest.CheckStream(t, got, ids)
	t.Logf("%d records for %d events: %d duplicates from the killed relay's unacknowledged records", len(got), len(ids), dups)
}

// TestRelayKinesisFlagErrors: a Kinesis target that cannot work fails at
// start-up with one line, never echoing credentials put in the URL.
func TestRelayKinesisFlagErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--broker", "kinesis://key:hunter2@outbox"}, "must not hold credentials"},
		{[]string{"--broker", "kinesis://outbox?endpoint=http://key:hunter2@host"}, "must not hold credentials"},
		{[]string{"--broker", "kinesis://outbox?token=hunter2"}, "unknown query parameter"},
		{[]string{"--broker", "kinesis://?region=us-east-1"}, "no Kinesis stream"},
		{[]string{"--broker", "kinesis://outbox", "--topic-template", "o-{aggregate_type}"}, "give one"},
		{[]string{"--broker", "kinesis://?region=us-east-1", "--topic-template", "o {aggregate_type}"}, "not allowed"},
	}
	for _, tc := range cases {
		_, errOut, code := run(t, append([]string{"relay", "--database-url", "postgres://x@127.0.0.1:1/db"}, tc.args...)...)
		if code != 2 || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 || strings.Contains(errOut, "hunter2") {
			t.Errorf("relay %v: exit %d, stderr %q, want one line with %q", tc.args, code, errOut, tc.want)
		}
	}
}
