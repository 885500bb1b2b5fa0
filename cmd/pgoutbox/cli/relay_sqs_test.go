package cli

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

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
	emu, client := startFauxqs(t)
	queue, url := fifoQueue(t, client)
	relayAWSSIGKILL(t, emu, client, "sqs", queue, url)
}

// The same for an SNS FIFO topic, read through a FIFO queue subscribed to it
// with raw delivery (body and attributes as published): SNS keeps the order
// per message group and drops a repeated deduplication id, as SQS does.
func TestRelaySNSSIGKILL(t *testing.T) {
	t.Parallel()
	emu, client := startFauxqs(t)
	topics := awssns.NewFromConfig(awsTestConfig(emu))
	created, err := topics.CreateTopic(t.Context(), &awssns.CreateTopicInput{
		Name: aws.String("relay-" + pgoutbox.NewEventID().String() + ".fifo"), Attributes: map[string]string{"FifoTopic": "true"}})
	pgtest.Must(t, err, "create topic")
	arn := aws.ToString(created.TopicArn)
	t.Cleanup(func() {
		_, _ = topics.DeleteTopic(context.Background(), &awssns.DeleteTopicInput{TopicArn: aws.String(arn)})
	})
	_, url := fifoQueue(t, client)
	a, err := client.GetQueueAttributes(t.Context(), &awssqs.GetQueueAttributesInput{QueueUrl: aws.String(url),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	pgtest.Must(t, err, "queue ARN")
	_, err = topics.Subscribe(t.Context(), &awssns.SubscribeInput{TopicArn: aws.String(arn), Protocol: aws.String("sqs"),
		Endpoint: aws.String(a.Attributes["QueueArn"]), Attributes: map[string]string{"RawMessageDelivery": "true"}})
	pgtest.Must(t, err, "subscribe the queue")
	relayAWSSIGKILL(t, emu, client, "sns", arn, url)
}

// startFauxqs starts an emulator of the test's own and returns it with an
// SQS client of it.
func startFauxqs(t *testing.T) (*fauxqs.Server, *awssqs.Client) {
	t.Helper()
	emu, err := fauxqs.Start()
	pgtest.Must(t, err, "start the SQS emulator")
	t.Cleanup(emu.Close)
	return emu, awssqs.NewFromConfig(awsTestConfig(emu))
}

// awsTestConfig is the emulator's client configuration without idle
// connections, so none outlives the test (goleak).
func awsTestConfig(emu *fauxqs.Server) aws.Config {
	cfg := emu.Config()
	cfg.HTTPClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	return cfg
}

// fifoQueue creates a FIFO queue of the test's own, deleted at its end.
func fifoQueue(t *testing.T, client *awssqs.Client) (name, url string) {
	t.Helper()
	name = "relay-" + pgoutbox.NewEventID().String() + ".fifo"
	created, err := client.CreateQueue(t.Context(), &awssqs.CreateQueueInput{QueueName: aws.String(name),
		Attributes: map[string]string{"FifoQueue": "true"}})
	pgtest.Must(t, err, "create queue")
	url = aws.ToString(created.QueueUrl)
	t.Cleanup(func() {
		_, _ = client.DeleteQueue(context.Background(), &awssqs.DeleteQueueInput{QueueUrl: aws.String(url)})
	})
	return name, url
}

// relayAWSSIGKILL runs a relay to --broker kind:// with --topic-template
// destination, SIGKILLs it mid-run, lets a successor finish, and checks what
// reached the queue at url: every event, in order per aggregate, none twice.
func relayAWSSIGKILL(t *testing.T, emu *fauxqs.Server, client *awssqs.Client, kind, destination, url string) {
	t.Helper()
	pool, schema := pgtest.Migrated(t, 8)
	e := &relayEnv{t: t, pool: pool, dbURL: pgtest.URL(), schema: schema}
	ids := e.enqueue(100, 20)
	env := []string{"AWS_ACCESS_KEY_ID=" + fauxqs.AccessKey, "AWS_SECRET_ACCESS_KEY=" + fauxqs.AccessKey,
		"AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null"}
	start := func(id string) *relayProc {
		return startRelayProc(t, "relay "+id, env, []string{"relay", "--database-url", pgtest.URL(), "--schema", schema, "--id", id,
			"--broker", kind + "://?region=" + fauxqs.Region + "&endpoint=" + emu.Endpoint,
			"--topic-template", destination, "--batch-size", "50", "--lease", "3s"})
	}
	victim := start("victim")
	wait.For(t, 60*time.Second, "the victim to publish some events", func() bool { return e.count("published_at IS NOT NULL") > 0 })
	victim.kill(t)
	left := e.count("published_at IS NULL")
	held := e.count("claimed_by = 'victim' AND published_at IS NULL")
	if left == 0 {
		t.Fatal("the victim published everything before it was killed; the test proves nothing")
	}
	start("successor")
	wait.For(t, 60*time.Second, "the successor to publish everything", func() bool { return e.count("published_at IS NULL") == 0 })

	got, err := fauxqs.Drain(t.Context(), client, url)
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
	t.Logf("%s: victim killed with %d of %d events left (%d under its leases); the successor finished, no duplicate stored", kind, left, len(ids), held)
}
