package cli

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/aws/sqs"
	"github.com/pgoutbox/pgoutbox/broker/kafka"
	"github.com/pgoutbox/pgoutbox/broker/mqtt"
	natsbroker "github.com/pgoutbox/pgoutbox/broker/nats"
	"github.com/pgoutbox/pgoutbox/broker/nats/natsembed"
	"github.com/pgoutbox/pgoutbox/broker/null"
	"github.com/pgoutbox/pgoutbox/broker/pubsub"
	"github.com/pgoutbox/pgoutbox/broker/rabbitmq"
	"github.com/pgoutbox/pgoutbox/broker/webhook"
)

// brokerKind is everything the CLI knows about one kind of broker. The table
// brokerKinds is the one place in the CLI that names the kinds
// (TestOnlyTheRegistryNamesBrokers): adding a broker is its package plus one
// entry here.
type brokerKind struct {
	name    string   // the kind, e.g. in a publish span's messaging.system unless system says otherwise
	system  string   // messaging.system of publish spans (OpenTelemetry); defaults to name
	schemes []string // URL schemes of --broker that choose it
	words   []string // whole --broker values that choose it, instead of a URL
	choices []string // its --broker forms, for help and errors
	help    string   // its lines in brokerHelp
	// cloudEvents names where --format cloudevents puts the attributes, and
	// display how the --format help names the kind; empty when another
	// kind's line says it (embedded is NATS).
	cloudEvents, display string
	// publicQuery: the URL's query is known to hold no secret, so describe
	// shows it.
	publicQuery bool
	// destination is the default destination template, tenantDestination the
	// one with --tenants; empty when the kind has none to name.
	destination, tenantDestination string

	// flags registers the kind's own flags and returns their values, which
	// parse and open find with kindFlags; nil when it has none.
	flags func(fs *pflag.FlagSet) any
	// parse checks the URL and the kind's flags without connecting anywhere,
	// after the common flags were checked (t.template is set).
	parse func(t *brokerTarget) error
	// open connects and returns the publisher and a function that closes
	// everything it opened.
	open func(ctx context.Context, t *brokerTarget, log *slog.Logger) (broker.Publisher, func(), error)
	// describe names the broker for logs and audit rows; nil: the URL with
	// credentials hidden (showBrokerURL).
	describe func(t *brokerTarget) string
	// tenants makes the target tell tenants apart (--tenants); nil: the
	// generic rule of brokerTarget.tenantTemplate.
	tenants func(t *brokerTarget) error
	// plaintext reports whether u, one URL of the --broker value raw, asks
	// for no TLS, so that its credentials would travel unencrypted; nil when
	// the kind never warns here. The warning (warnPlaintextCredentials) names
	// tls, the form that asks for TLS.
	plaintext func(u *url.URL, raw string) bool
	tls       string
	// password returns the password the kind read apart from the URL (from
	// the environment or a file, by parse): with it, a URL without user info
	// carries credentials too; nil when the kind reads none.
	password func(t *brokerTarget) string
	// secretEnv are the environment variables the kind reads a secret from
	// (no flag holds a secret): `pgoutbox bench` passes them on to its relays
	// and hides their values (benchRelayEnv).
	secretEnv []string
	// perRelay returns, as environment entries, the kind's settings that must
	// differ between the relay processes of one `pgoutbox bench` (MQTT's
	// client id) for the relay with the given id; nil when none must.
	perRelay func(id string) []string
}

// embeddedBroker is the --broker value (and the demo's --nats-url value) that
// starts an in-process NATS JetStream server.
const embeddedBroker = "embedded"

// redisKind is the kind of Redis Streams, which broker_redis.go finds its
// flags by.
const redisKind = "redis"

// natsDestination is the NATS adapter's default subject template.
const natsDestination = "outbox.{aggregate_type}.{event_type}"

// brokerKinds is the registry, in the order --help lists the kinds.
var brokerKinds = []*brokerKind{
	{
		name: embeddedBroker, system: "nats", words: []string{embeddedBroker}, choices: []string{embeddedBroker},
		help: `  embedded            an in-process NATS JetStream server (for trying things out): the
                      events go to a server inside this process and are lost with its
                      data in --embedded-dir (a WARN says so); clients may connect on
                      --embedded-port`,
		destination: natsDestination, tenantDestination: "outbox.{tenant}.{aggregate_type}.{event_type}",
		flags: func(fs *pflag.FlagSet) any {
			o := &embeddedFlags{}
			fs.StringVar(&o.dir, "embedded-dir", defaultEmbeddedDir(), "data directory of --broker embedded (env PGOUTBOX_EMBEDDED_DIR)")
			fs.IntVar(&o.port, "embedded-port", -1, "client port of --broker embedded; -1 picks a free one (env PGOUTBOX_EMBEDDED_PORT)")
			return o
		},
		parse: func(t *brokerTarget) error {
			o := kindFlags[embeddedFlags](t.flags, embeddedBroker)
			if o.dir == "" {
				return usagef("--embedded-dir must not be empty")
			}
			if o.port < -1 || o.port > 65535 {
				return usagef("--embedded-port %d: want -1 (any free port) or 0..65535", o.port)
			}
			return parseNATS(t)
		},
		open: openEmbedded,
		describe: func(t *brokerTarget) string {
			return "embedded (in-process NATS JetStream, " + kindFlags[embeddedFlags](t.flags, embeddedBroker).dir + ")"
		},
		tenants: natsTenants,
	},
	{
		name: "nats", schemes: []string{"nats", "tls", "ws", "wss"}, choices: []string{"nats://host:4222", "tls://…"},
		help: `  nats://host:4222    NATS JetStream; several servers comma-separated; tls:// for TLS.
                      Stream --nats-stream (created if missing on --nats-stream-subjects),
                      subject --topic-template (default outbox.{aggregate_type}.{event_type}),
                      Nats-Msg-Id = event id so re-publishes are dropped as duplicates`,
		cloudEvents: "ce-* headers", display: "NATS",
		destination: natsDestination, tenantDestination: "outbox.{tenant}.{aggregate_type}.{event_type}",
		flags: func(fs *pflag.FlagSet) any {
			o := &natsFlags{}
			fs.StringVar(&o.stream, "nats-stream", "OUTBOX", "JetStream stream to publish into (env PGOUTBOX_NATS_STREAM)")
			fs.StringSliceVar(&o.subjects, "nats-stream-subjects", nil, "subjects of the stream when it has to be created (env PGOUTBOX_NATS_STREAM_SUBJECTS) (default: the template's literal prefix + \".>\", e.g. outbox.>)")
			return o
		},
		parse:   parseNATS,
		open:    openNATS,
		tenants: natsTenants,
		plaintext: func(u *url.URL, _ string) bool {
			return u.Scheme == "nats" || u.Scheme == "ws" // unless the server itself demands TLS
		},
		tls: "tls:// or wss://",
	},
	{
		name: "kafka", schemes: []string{"kafka"}, choices: []string{"kafka://host:9092"},
		help: `  kafka://host:9092[,host:9092][?tls=true&sasl=plain|scram-sha-256|scram-sha-512]
                      Kafka (user:password@ before the hosts for SASL): idempotent producer,
                      acks=all, record key = aggregate id (one aggregate, one partition),
                      topic --topic-template (default outbox.{aggregate_type})`,
		cloudEvents: "ce_*", display: "Kafka",
		publicQuery: true, // tls, sasl
		destination: "outbox.{aggregate_type}", tenantDestination: "outbox.{tenant}.{aggregate_type}",
		parse: func(t *brokerTarget) error {
			if _, err := kafka.ParseURL(t.flags.url); err != nil {
				return usagef("--broker: %v", err)
			}
			return nil
		},
		open: openKafka,
		plaintext: func(_ *url.URL, raw string) bool {
			return !strings.Contains(strings.ToLower(raw), "tls=true") // the query ends the list
		},
		tls: "kafka://…?tls=true",
	},
	{
		name: "rabbitmq", schemes: []string{"amqp", "amqps"}, choices: []string{"amqp://user:pass@host/vhost", "amqps://…"},
		help: `  amqp://user:pass@host:5672/vhost   RabbitMQ (amqps:// for TLS): publisher confirms,
                      persistent messages, topic exchange --amqp-exchange (declared if
                      missing), routing key --topic-template (default
                      {aggregate_type}.{event_type}), message_id = event id; an unroutable
                      message is an error (bind a queue), retried like any other`,
		cloudEvents: "cloudEvents_*", display: "RabbitMQ",
		destination: "{aggregate_type}.{event_type}", tenantDestination: "{tenant}.{aggregate_type}.{event_type}",
		flags: func(fs *pflag.FlagSet) any {
			o := &rabbitmqFlags{}
			fs.StringVar(&o.exchange, "amqp-exchange", "outbox", "RabbitMQ topic exchange to publish to (env PGOUTBOX_AMQP_EXCHANGE)")
			return o
		},
		open: openRabbitMQ,
		plaintext: func(u *url.URL, _ string) bool {
			return u.Scheme == "amqp"
		},
		tls: "amqps://",
	},
	{
		name: "webhook", schemes: []string{"https", "http"}, choices: []string{"https://host/path", "http://…"},
		help: `  https://host/path   HTTP webhook: one signed POST per event (http:// too). The path may
                      hold {aggregate_type}, {event_type}, … placeholders. The HMAC secret
                      comes from PGOUTBOX_WEBHOOK_SECRET or --webhook-secret-file (never a
                      flag value, so it stays out of ps); receivers verify Outbox-Signature
                      with the Go helper webhook.Verifier. A Standard Webhooks secret
                      (whsec_…) from PGOUTBOX_WEBHOOK_STANDARD_SECRET or
                      --webhook-standard-secret-file adds webhook-id, -timestamp and
                      -signature headers for the standardwebhooks libraries (with it,
                      PGOUTBOX_WEBHOOK_SECRET is optional). 2xx acks; 400/404/… quarantine;
                      408/429/502-504, timeouts and connection errors retry; 401/403 are a
                      configuration error: retried, never quarantined, readiness fails`,
		cloudEvents: "ce-* headers", display: "webhooks",
		flags: func(fs *pflag.FlagSet) any {
			o := &webhookFlags{}
			fs.StringVar(&o.secretFile, "webhook-secret-file", "", "file holding the webhook HMAC secret; else PGOUTBOX_WEBHOOK_SECRET is used (env PGOUTBOX_WEBHOOK_SECRET_FILE)")
			fs.StringVar(&o.standardSecretFile, "webhook-standard-secret-file", "", "file holding a Standard Webhooks secret (whsec_ + base64 of 24 to 64 bytes) to sign with beside Outbox-Signature; else PGOUTBOX_WEBHOOK_STANDARD_SECRET is used (env PGOUTBOX_WEBHOOK_STANDARD_SECRET_FILE)")
			fs.BoolVar(&o.unsigned, "webhook-unsigned", false, "send webhook requests without a signature (env PGOUTBOX_WEBHOOK_UNSIGNED)")
			return o
		},
		parse:     parseWebhook,
		open:      openWebhook,
		secretEnv: []string{webhookSecretEnv, standardSecretEnv},
		tenants: func(t *brokerTarget) error {
			if !strings.Contains(t.flags.url, "{tenant}") {
				return usagef("--broker: serving several outboxes (--tenants), the webhook URL must hold {tenant} so that tenants' events stay apart")
			}
			return nil
		},
		// Webhooks warn in broker/webhook.
	},
	{
		name: "kinesis", schemes: []string{"kinesis"}, choices: []string{"kinesis://stream"},
		help: `  kinesis://stream[?region=…&endpoint=…]   Amazon Kinesis Data Streams: one record per
                      event, a JSON envelope of the Outbox-* headers and the payload;
                      partition key = aggregate (one aggregate, one shard), written one
                      at a time per aggregate in order. A stream template with
                      placeholders goes in --topic-template. Credentials from the AWS
                      default chain only (AWS_* variables, shared files, roles)`,
		cloudEvents: "a structured-mode JSON record", display: "Kinesis",
		parse:    parseKinesis,
		open:     openKinesis,
		describe: describeKinesis,
		tenants:  kinesisTenants,
	},
	{
		name: "mqtt", schemes: []string{"mqtt", "mqtts"}, choices: []string{"mqtt://[user@]host:1883", "mqtts://…"},
		help: `  mqtt://[user@]host:1883   MQTT 3.1.1, or 5 with --mqtt-version 5 (mqtts:// for TLS): QoS 1
                      (--mqtt-qos 2 for QoS 2), persistent session under --mqtt-client-id
                      (required), topic --topic-template (default
                      outbox/{aggregate_type}/{event_type}); on 3.1.1 the outbox fields
                      travel in a JSON envelope (no headers), on 5 as user properties
                      beside the payload as it is. The password comes from
                      PGOUTBOX_MQTT_PASSWORD or --mqtt-password-file`,
		cloudEvents: "structured-mode JSON (3.1.1) or user properties (5)", display: "MQTT",
		destination: mqtt.DefaultTopic, tenantDestination: "outbox/{tenant}/{aggregate_type}/{event_type}",
		flags: registerMQTTFlags,
		parse: func(t *brokerTarget) error { return parseMQTT(t, kindFlags[mqttFlags](t.flags, "mqtt")) },
		open: func(ctx context.Context, t *brokerTarget, log *slog.Logger) (broker.Publisher, func(), error) {
			return openMQTT(ctx, t, kindFlags[mqttFlags](t.flags, "mqtt"), log)
		},
		plaintext: func(u *url.URL, _ string) bool { return u.Scheme == "mqtt" },
		tls:       "mqtts://",
		password:  func(t *brokerTarget) string { return kindFlags[mqttFlags](t.flags, "mqtt").password },
		secretEnv: []string{mqttPasswordEnv},
		perRelay:  mqttClientIDPerRelay,
	},
	{
		name: redisKind, schemes: []string{"redis", "rediss"}, choices: []string{"redis://host:6379", "rediss://…"},
		help: `  redis://[user@]host:6379[/db]   Redis Streams (rediss:// for TLS): XADD to the stream
                      --topic-template (default outbox.{aggregate_type}); a Lua script drops
                      a repeated event id within --redis-dedup-window. The password comes
                      from PGOUTBOX_REDIS_PASSWORD or --redis-password-file, never the URL.
                      --redis-max-len trims streams (off by default: trimming can drop
                      unread events); a server that persists nothing is warned about`,
		cloudEvents: "ce-* fields", display: "Redis Streams",
		destination: "outbox.{aggregate_type}", tenantDestination: "outbox.{tenant}.{aggregate_type}",
		flags: redisFlagSet,
		parse: parseRedis,
		open:  openRedis,
		plaintext: func(u *url.URL, _ string) bool {
			return u.Scheme == "redis"
		},
		tls:       "rediss://",
		password:  func(t *brokerTarget) string { return kindFlags[redisFlags](t.flags, redisKind).password },
		secretEnv: []string{redisPasswordEnv},
	},
	{
		name: "sqs", schemes: []string{"sqs"}, choices: []string{"sqs://[queue]?region=…"},
		help: `  sqs://[queue][?region=…&endpoint=…]   Amazon SQS FIFO queue: queue name or URL from
                      the host or --topic-template (default outbox-{aggregate_type}.fifo),
                      MessageGroupId = aggregate, MessageDeduplicationId = event id; a
                      standard queue is refused unless --sqs-allow-standard. Credentials
                      from the AWS default chain only (environment, shared files, role)`,
		cloudEvents: "a structured JSON body", display: "SQS",
		publicQuery: true, // region, endpoint (checked to hold no credentials)
		destination: sqs.DefaultQueue, tenantDestination: "outbox-{tenant}-{aggregate_type}.fifo",
		flags: awsAllowStandardFlag("sqs", "SQS queue"),
		parse: func(t *brokerTarget) error { return parseAWS(t, false) },
		open: func(ctx context.Context, t *brokerTarget, log *slog.Logger) (broker.Publisher, func(), error) {
			return openAWS(ctx, t, log, false)
		},
	},
	{
		name: "sns", schemes: []string{"sns"}, choices: []string{"sns://?region=…"},
		help: `  sns://[?region=…&endpoint=…]   Amazon SNS FIFO topic: --topic-template is the topic
                      ARN (required); group and deduplication ids as for SQS; a standard
                      topic is refused unless --sns-allow-standard`,
		cloudEvents: "a structured JSON body", display: "SNS",
		publicQuery: true,
		flags:       awsAllowStandardFlag("sns", "SNS topic"),
		parse:       func(t *brokerTarget) error { return parseAWS(t, true) },
		open: func(ctx context.Context, t *brokerTarget, log *slog.Logger) (broker.Publisher, func(), error) {
			return openAWS(ctx, t, log, true)
		},
	},
	{
		name: "pubsub", system: "gcp_pubsub", schemes: []string{"pubsub"}, choices: []string{"pubsub://project/topic"},
		help: `  pubsub://project[/topic][?endpoint=host:port]   Google Cloud Pub/Sub: message ordering
                      on, ordering key = aggregate, the Outbox-* headers as attributes;
                      topic from the URL or --topic-template (default
                      outbox.{aggregate_type}; topics must exist). Credentials from
                      Application Default Credentials only (GOOGLE_APPLICATION_CREDENTIALS,
                      the metadata server); endpoint= or PUBSUB_EMULATOR_HOST for an emulator`,
		cloudEvents: "ce-* attributes", display: "Pub/Sub",
		publicQuery: true, // endpoint
		destination: pubsub.DefaultTopic, tenantDestination: "outbox.{tenant}.{aggregate_type}",
		parse:    parsePubSub,
		open:     openPubSub,
		describe: describePubSub,
	},
	{
		name: "null", words: []string{"null://", "null"}, choices: []string{"null://"},
		help: `  null://             acknowledges everything and keeps nothing (benchmarks, dry runs)`,
		open: func(context.Context, *brokerTarget, *slog.Logger) (broker.Publisher, func(), error) {
			return &null.Publisher{}, func() {}, nil
		},
		describe: func(*brokerTarget) string { return "null://" },
		tenants:  func(*brokerTarget) error { return nil }, // nothing is kept to collide
	},
}

// webhookSecretEnv holds the webhook HMAC secret when --webhook-secret-file
// is not given.
const webhookSecretEnv = "PGOUTBOX_WEBHOOK_SECRET"

// awsEndpointSchemes are the schemes of an sqs:// or sns:// URL's ?endpoint=.
var awsEndpointSchemes = []string{"https", "http"}

// natsFlags are the flags of NATS JetStream, the embedded server's too.
type natsFlags struct {
	stream   string
	subjects []string
}

// embeddedFlags are the flags of --broker embedded.
type embeddedFlags struct {
	dir  string
	port int
}

// rabbitmqFlags are the flags of RabbitMQ.
type rabbitmqFlags struct {
	exchange string
}

// webhookFlags are the flags of webhooks, and the secret parse read.
type webhookFlags struct {
	secretFile string
	unsigned   bool
	secret     []byte // read by parse

	standardSecretFile string
	standardSecret     []byte // decoded by parse
}

// defaultEmbeddedDir is where --broker embedded keeps its data unless told.
func defaultEmbeddedDir() string { return filepath.Join(os.TempDir(), "pgoutbox-embedded-nats") }

// parseNATS derives the stream's subjects from --topic-template unless
// --nats-stream-subjects gives them.
func parseNATS(t *brokerTarget) error {
	t.streamSubjects = kindFlags[natsFlags](t.flags, "nats").subjects
	if len(t.streamSubjects) == 0 && t.template != nil {
		// The template's leading literal tokens, e.g. "events.{aggregate_type}" → "events.>".
		lit, _, _ := strings.Cut(t.flags.topicTemplate, "{")
		prefix := lit[:strings.LastIndexByte(lit, '.')+1]
		if prefix == "" {
			return usagef("--topic-template %q starts with a placeholder: give the stream's subjects with --nats-stream-subjects", t.flags.topicTemplate)
		}
		t.streamSubjects = []string{prefix + ">"}
	}
	return nil
}

// natsTenants is the generic tenant rule, and a stream that holds every
// tenant's subjects.
func natsTenants(t *brokerTarget) error {
	if err := t.tenantTemplate(); err != nil {
		return err
	}
	if len(t.streamSubjects) == 0 {
		t.streamSubjects = []string{"outbox.>"}
	}
	return nil
}

// dialNATS connects to the NATS server at serverURL.
func dialNATS(ctx context.Context, t *brokerTarget, serverURL string, log *slog.Logger) (*natsbroker.Publisher, error) {
	o := kindFlags[natsFlags](t.flags, "nats")
	cfg := natsbroker.Config{Stream: o.stream, StreamSubjects: t.streamSubjects, AckTimeout: t.flags.ackTimeout, Logger: log, Encoding: t.encoding}
	if t.template != nil {
		cfg.Subject = *t.template
	}
	pub, err := natsbroker.Dial(ctx, serverURL, &cfg)
	if err != nil {
		return nil, usageError{err}
	}
	return pub, nil
}

// openNATS connects to NATS JetStream.
func openNATS(ctx context.Context, t *brokerTarget, log *slog.Logger) (broker.Publisher, func(), error) {
	pub, err := dialNATS(ctx, t, t.flags.url, log)
	if err != nil {
		return nil, nil, err
	}
	return pub, func() { _ = pub.Close() }, nil
}

// openEmbedded starts the in-process NATS server and connects to it.
func openEmbedded(ctx context.Context, t *brokerTarget, log *slog.Logger) (broker.Publisher, func(), error) {
	o := kindFlags[embeddedFlags](t.flags, embeddedBroker)
	var serverLog *slog.Logger // the server's own chatter only at --log-level debug
	if log.Enabled(ctx, slog.LevelDebug) {
		serverLog = log.With(slog.String("component", "embedded-nats"))
	}
	embedded, err := natsembed.New(&natsembed.Config{StoreDir: o.dir, Port: o.port, Logger: serverLog})
	if err != nil {
		return nil, nil, fmt.Errorf("start embedded NATS server: %w", err)
	}
	log.Warn("--broker embedded: events go to a NATS server inside this process; consumers elsewhere never see them, and they are lost with its data directory",
		slog.String("url", embedded.URL()), slog.String("dir", o.dir))
	pub, err := dialNATS(ctx, t, embedded.URL(), log)
	if err != nil {
		embedded.Shutdown()
		return nil, nil, err
	}
	return pub, func() {
		_ = pub.Close()
		embedded.Shutdown()
	}, nil
}

// openKafka connects to Kafka and refuses credentials the cluster refuses.
func openKafka(ctx context.Context, t *brokerTarget, log *slog.Logger) (broker.Publisher, func(), error) {
	cfg := kafka.Config{ProduceTimeout: t.flags.ackTimeout, Logger: log, Encoding: t.encoding}
	if t.template != nil {
		cfg.Topic = *t.template
	}
	pub, err := kafka.Dial(ctx, t.flags.url, &cfg)
	if err != nil {
		return nil, nil, usageError{err}
	}
	// Credentials the cluster refuses are a configuration error: stop now
	// rather than retry every event forever. A cluster that does not answer
	// within --ack-timeout is waited for by the publishes, as before.
	pctx, cancel := context.WithTimeout(ctx, t.flags.ackTimeout)
	perr := pub.Ping(pctx)
	cancel()
	if kafka.IsAuthError(perr) {
		_ = pub.Close()
		return nil, nil, usageError{fmt.Errorf("--broker: the Kafka cluster refused the credentials: %w", perr)}
	}
	return pub, func() { _ = pub.Close() }, nil
}

// openRabbitMQ connects to RabbitMQ.
func openRabbitMQ(ctx context.Context, t *brokerTarget, log *slog.Logger) (broker.Publisher, func(), error) {
	cfg := rabbitmq.Config{Exchange: kindFlags[rabbitmqFlags](t.flags, "rabbitmq").exchange, ConfirmTimeout: t.flags.ackTimeout,
		Logger: log, Encoding: t.encoding}
	if t.template != nil {
		cfg.RoutingKey = *t.template
	}
	pub, err := rabbitmq.Dial(ctx, t.flags.url, &cfg)
	if err != nil {
		// A malformed URL or a server that turned us away (403
		// ACCESS_REFUSED, an unknown vhost): Dial waits out an unreachable
		// server instead.
		return nil, nil, usageError{err}
	}
	return pub, func() { _ = pub.Close() }, nil
}

// openWebhook makes the webhook's HTTP client.
func openWebhook(_ context.Context, t *brokerTarget, log *slog.Logger) (broker.Publisher, func(), error) {
	o := kindFlags[webhookFlags](t.flags, "webhook")
	pub, err := webhook.New(&webhook.Config{URL: t.flags.url, Secret: o.secret, StandardSecret: o.standardSecret, AllowUnsigned: o.unsigned,
		Timeout: t.flags.ackTimeout, Logger: log, Encoding: t.encoding})
	if err != nil {
		return nil, nil, usageError{err}
	}
	return pub, func() { _ = pub.Close() }, nil
}

// parseWebhook checks the URL and reads the signing secret.
func parseWebhook(t *brokerTarget) error {
	if _, err := webhook.ParseURL(t.flags.url); err != nil {
		return usagef("--broker: %v", err)
	}
	if t.flags.topicTemplate != "" {
		return usagef("--topic-template does not apply to webhooks: put placeholders in the URL's path")
	}
	o := kindFlags[webhookFlags](t.flags, "webhook")
	switch {
	case o.secretFile != "":
		text, err := readSecretFile("--webhook-secret-file", o.secretFile)
		if err != nil {
			return err
		}
		o.secret = []byte(text)
	default:
		o.secret = []byte(os.Getenv(webhookSecretEnv))
	}
	if err := readStandardSecret(o); err != nil {
		return err
	}
	switch {
	case len(o.secret) == 0 && len(o.standardSecret) == 0 && !o.unsigned:
		return usagef("a webhook needs a signing secret: set PGOUTBOX_WEBHOOK_SECRET or --webhook-secret-file, or a Standard Webhooks one (PGOUTBOX_WEBHOOK_STANDARD_SECRET, --webhook-standard-secret-file), or --webhook-unsigned")
	case len(o.secret) > 0 && len(o.secret) < webhook.MinSecretLen:
		return usagef("the webhook secret is %d bytes; use at least %d (32 random bytes are good)", len(o.secret), webhook.MinSecretLen)
	}
	return nil
}
