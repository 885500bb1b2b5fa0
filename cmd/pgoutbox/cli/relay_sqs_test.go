package cli

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/aws/fauxqs"
	"github.com/pgoutbox/pgoutbox/broker/aws/sqs"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/wire"
)

// A relay SIGKILLed mid-run towards an SQS FIFO queue (the fauxqs emulator)
// and a second one that finishes: every event arrives, in order per
// aggregate, and the events the first had sent and the second sent again are
// dropped by their deduplication id.
func TestRelaySQSSIGKILL(t *testing.T) {
	t.Parallel()
	emu, err := fauxqs.Start()
	pgtest.Must(t, err, "start the SQS emulator")
	t.Cleanup(emu.Close)
	cfg := emu.Config()
	cfg.HTTPClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}} // no idle connection outlives the test (goleak)
	client := awssqs.NewFromConfig(cfg)
	queue := "relay-" + pgoutbox.NewEventID().String() + ".fifo"
	created, err := client.CreateQueue(t.Context(), &awssqs.CreateQueueInput{QueueName: aws.String(queue),
		Attributes: map[string]string{"FifoQueue": "true"}})
	pgtest.Must(t, err, "create queue")

	pool, schema := pgtest.Migrated(t, 8)
	e := &relayEnv{t: t, pool: pool, dbURL: pgtest.URL(), schema: schema}
	ids := e.enqueue(100, 20)
	env := []string{"AWS_ACCESS_KEY_ID=" + fauxqs.AccessKey, "AWS_SECRET_ACCESS_KEY=" + fauxqs.AccessKey,
		"AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null"}
	start := func(id string) *relayProc {
		return startRelayProc(t, "relay "+id, env, []string{"relay", "--database-url", pgtest.URL(), "--schema", schema, "--id", id,
			"--broker", "sqs://?region=" + fauxqs.Region + "&endpoint=" + emu.Endpoint,
			"--topic-template", queue, "--batch-size", "50", "--lease", "3s"})
	}
	victim := start("victim")
	wait.For(t, 60*time.Second, "the victim to publish some events", func() bool { return e.count("published_at IS NOT NULL") > 0 })
	pgtest.Must(t, victim.cmd.Process.Kill(), "SIGKILL")
	<-victim.done
	left := e.count("published_at IS NULL")
	held := e.count("claimed_by = 'victim' AND published_at IS NULL")
	if left == 0 {
		t.Fatal("the victim published everything before it was killed; the test proves nothing")
	}
	start("successor")
	wait.For(t, 60*time.Second, "the successor to publish everything", func() bool { return e.count("published_at IS NULL") == 0 })

	got, err := fauxqs.Drain(t.Context(), client, aws.ToString(created.QueueUrl))
	pgtest.Must(t, err, "drain")
	msgs := make([]broker.Message, len(got))
	for i, m := range got {
		h, err := sqs.Headers(fauxqs.Attributes(m))
		pgtest.Must(t, err, "headers")
		names := make([]string, 0, len(h))
		for k := range h {
			names = append(names, k)
		}
		msgs[i], err = wire.ParseReceived([]byte(aws.ToString(m.Body)), names, func(n string) string { return h[n] })
		pgtest.Must(t, err, "parse message %d", i)
	}
	if dups := brokertest.CheckStream(t, msgs, ids); dups != 0 {
		t.Errorf("%d duplicates reached the queue; the deduplication id should drop them", dups)
	}
	t.Logf("victim killed with %d of %d events left (%d under its leases); the successor finished, no duplicate stored", left, len(ids), held)
	_, _ = client.DeleteQueue(context.Background(), &awssqs.DeleteQueueInput{QueueUrl: created.QueueUrl})
}
