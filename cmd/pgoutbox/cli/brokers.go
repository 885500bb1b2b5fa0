package cli

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/kafka"
	natsbroker "github.com/pgoutbox/pgoutbox/broker/nats"
	"github.com/pgoutbox/pgoutbox/broker/nats/natsembed"
	"github.com/pgoutbox/pgoutbox/broker/null"
	"github.com/pgoutbox/pgoutbox/broker/rabbitmq"
	"github.com/pgoutbox/pgoutbox/broker/webhook"
	"github.com/pgoutbox/pgoutbox/internal/redact"
)

const brokerHelp = `Brokers (--broker, env PGOUTBOX_BROKER; there is no default: without one the
command refuses to start, exit status 2):
  embedded            an in-process NATS JetStream server (for trying things out): the
                      events go to a server inside this process and are lost with its
                      data in --embedded-dir (a WARN says so); clients may connect on
                      --embedded-port
  nats://host:4222    NATS JetStream; several servers comma-separated; tls:// for TLS.
                      Stream --nats-stream (created if missing on --nats-stream-subjects),
                      subject --topic-template (default outbox.{aggregate_type}.{event_type}),
                      Nats-Msg-Id = event id so re-publishes are dropped as duplicates
  kafka://host:9092[,host:9092][?tls=true&sasl=plain|scram-sha-256|scram-sha-512]
                      Kafka (user:password@ before the hosts for SASL): idempotent producer,
                      acks=all, record key = aggregate id (one aggregate, one partition),
                      topic --topic-template (default outbox.{aggregate_type})
  amqp://user:pass@host:5672/vhost   RabbitMQ (amqps:// for TLS): publisher confirms,
                      persistent messages, topic exchange --amqp-exchange (declared if
                      missing), routing key --topic-template (default
                      {aggregate_type}.{event_type}), message_id = event id; an unroutable
                      message is an error (bind a queue), retried like any other
  https://host/path   HTTP webhook: one signed POST per event (http:// too). The path may
                      hold {aggregate_type}, {event_type}, … placeholders. The HMAC secret
                      comes from PGOUTBOX_WEBHOOK_SECRET or --webhook-secret-file (never a
                      flag value, so it stays out of ps); receivers verify Outbox-Signature
                      with the Go helper webhook.Verifier. 2xx acks; 400/404/… quarantine;
                      408/429/502-504, timeouts and connection errors retry; 401/403 are a
                      configuration error: retried, never quarantined, readiness fails
  null://             acknowledges everything and keeps nothing (benchmarks, dry runs)

Templates (--topic-template, and a webhook URL's path) may use {aggregate_type},
{aggregate_id}, {event_type}, {schema_version} and {tenant} (the schema, or with
--tenants the tenant name); a webhook puts each value in the path as one escaped
segment. With --format cloudevents the source is /pgoutbox/<schema> unless
--ce-source, whichever command publishes.`

// brokerFlags select and configure the broker of the relay (and later of replay).
type brokerFlags struct {
	url           string
	embeddedDir   string
	embeddedPort  int
	topicTemplate string
	natsStream    string
	natsSubjects  []string
	ackTimeout    time.Duration
	secretFile    string
	unsigned      bool
	amqpExchange  string
	format        string
	ceSource      string
}

func (b *brokerFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&b.url, "broker", "", "where to publish, required: "+brokerChoices+" (env PGOUTBOX_BROKER) (no default)")
	fs.StringVar(&b.embeddedDir, "embedded-dir", defaultEmbeddedDir(), "data directory of --broker embedded (env PGOUTBOX_EMBEDDED_DIR)")
	fs.IntVar(&b.embeddedPort, "embedded-port", -1, "client port of --broker embedded; -1 picks a free one (env PGOUTBOX_EMBEDDED_PORT)")
	fs.StringVar(&b.topicTemplate, "topic-template", "", "destination template: NATS subject (env PGOUTBOX_TOPIC_TEMPLATE) (default per broker)")
	fs.StringVar(&b.natsStream, "nats-stream", "OUTBOX", "JetStream stream to publish into (env PGOUTBOX_NATS_STREAM)")
	fs.StringSliceVar(&b.natsSubjects, "nats-stream-subjects", nil, "subjects of the stream when it has to be created (env PGOUTBOX_NATS_STREAM_SUBJECTS) (default: the template's literal prefix + \".>\", e.g. outbox.>)")
	fs.DurationVar(&b.ackTimeout, "ack-timeout", 5*time.Second, "how long to wait for the broker's ack of one message; the request timeout of a webhook (env PGOUTBOX_ACK_TIMEOUT)")
	fs.StringVar(&b.amqpExchange, "amqp-exchange", "outbox", "RabbitMQ topic exchange to publish to (env PGOUTBOX_AMQP_EXCHANGE)")
	fs.StringVar(&b.secretFile, "webhook-secret-file", "", "file holding the webhook HMAC secret; else PGOUTBOX_WEBHOOK_SECRET is used (env PGOUTBOX_WEBHOOK_SECRET_FILE)")
	fs.BoolVar(&b.unsigned, "webhook-unsigned", false, "send webhook requests without a signature (env PGOUTBOX_WEBHOOK_UNSIGNED)")
	fs.StringVar(&b.format, "format", broker.FormatNameOutbox, "wire format: outbox (Outbox-* headers) or cloudevents (CloudEvents 1.0 binary mode: "+
		"ce-* headers on NATS and webhooks, ce_* on Kafka, cloudEvents_* on RabbitMQ; see docs/consumer.md) (env PGOUTBOX_FORMAT)")
	fs.StringVar(&b.ceSource, "ce-source", "", "CloudEvents source attribute of --format cloudevents, a URI-reference (env PGOUTBOX_CE_SOURCE) (default /pgoutbox/<schema>)")
}

// brokerTarget is a checked --broker choice, ready to open.
type brokerTarget struct {
	flags          *brokerFlags
	kind           string // embedded, nats, kafka, rabbitmq, webhook, null
	template       *broker.Template
	streamSubjects []string
	secret         []byte // webhook
	encoding       broker.Encoding
}

// webhookSecret reads the HMAC secret from --webhook-secret-file or
// PGOUTBOX_WEBHOOK_SECRET.
func (b *brokerFlags) webhookSecret() ([]byte, error) {
	var secret []byte
	switch {
	case b.secretFile != "":
		raw, err := os.ReadFile(b.secretFile)
		if err != nil {
			return nil, usagef("--webhook-secret-file: %v", err)
		}
		secret = bytes.TrimRight(raw, "\r\n")
	default:
		secret = []byte(os.Getenv("PGOUTBOX_WEBHOOK_SECRET"))
	}
	switch {
	case len(secret) == 0 && !b.unsigned:
		return nil, usagef("a webhook needs a signing secret: set PGOUTBOX_WEBHOOK_SECRET or --webhook-secret-file (or --webhook-unsigned)")
	case len(secret) > 0 && len(secret) < webhook.MinSecretLen:
		return nil, usagef("the webhook secret is %d bytes; use at least %d (32 random bytes are good)", len(secret), webhook.MinSecretLen)
	}
	return secret, nil
}

// schemeShape is a URL scheme as RFC 3986 has it, bounded: the one part of a
// broker URL that does not parse that an error shows.
var schemeShape = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]{0,15}$`)

// brokerChoices lists the --broker forms, for help and errors.
const brokerChoices = "nats://host:4222, tls://…, kafka://host:9092, amqp://user:pass@host/vhost, amqps://…, https://host/path, http://…, null:// or embedded"

// redactURL names a URL without its credentials (internal/redact).
func redactURL(u *url.URL) string { return redact.URL(u.String()) }

// parse checks the broker flags without connecting anywhere, so that a typo fails
// at start-up with one line. The CloudEvents source, unless
// --ce-source, is each event's own (broker.Encoding.Source).
func (b *brokerFlags) parse() (*brokerTarget, error) {
	t := &brokerTarget{flags: b}
	format, err := broker.ParseFormat(b.format)
	if err != nil {
		return nil, usagef("--format: %v", err)
	}
	t.encoding.Format = format
	if format == broker.FormatCloudEvents {
		// Empty: each event's own, /pgoutbox/<schema> (broker.Encoding.Source).
		t.encoding.CloudEventsSource = b.ceSource
		if err := t.encoding.Validate(); err != nil {
			return nil, usagef("--ce-source: %v", err)
		}
	} else if b.ceSource != "" {
		return nil, usagef("--ce-source applies to --format cloudevents only")
	}
	switch {
	case strings.TrimSpace(b.url) == "":
		return nil, usagef("no broker: set --broker or PGOUTBOX_BROKER (there is no default); want one of %s", brokerChoices)
	case b.url == "embedded":
		if b.embeddedDir == "" {
			return nil, usagef("--embedded-dir must not be empty")
		}
		if b.embeddedPort < -1 || b.embeddedPort > 65535 {
			return nil, usagef("--embedded-port %d: want -1 (any free port) or 0..65535", b.embeddedPort)
		}
		t.kind = "embedded"
	case b.url == "null://" || b.url == "null":
		t.kind = "null"
	default:
		u, err := url.Parse(strings.TrimSpace(strings.Split(b.url, ",")[0]))
		if err != nil || u.Scheme == "" {
			// Not shown, not even redacted: a value that does not parse cannot be
			// told apart into credentials and the rest (a token put in the
			// wrong variable has no '@').
			shown := "(PGOUTBOX_BROKER)"
			if scheme, _, ok := strings.Cut(b.url, "://"); ok && schemeShape.MatchString(scheme) {
				shown = scheme + "://…"
			}
			return nil, usagef("--broker %s is not a broker URL; the value is not shown, as it may hold credentials (want embedded, nats://host:port, https://host/path or null://)", shown)
		}
		switch u.Scheme {
		case "nats", "tls", "ws", "wss":
			t.kind = "nats"
		case "kafka":
			if _, err := kafka.ParseURL(b.url); err != nil {
				return nil, usagef("--broker: %v", err)
			}
			t.kind = "kafka"
		case "amqp", "amqps":
			t.kind = "rabbitmq"
		case "http", "https":
			if _, err := webhook.ParseURL(b.url); err != nil {
				return nil, usagef("--broker: %v", err)
			}
			if b.topicTemplate != "" {
				return nil, usagef("--topic-template does not apply to webhooks: put placeholders in the URL's path")
			}
			secret, err := b.webhookSecret()
			if err != nil {
				return nil, err
			}
			t.kind, t.secret = "webhook", secret
		default:
			return nil, usagef("--broker %s: unknown scheme %q (want embedded, nats://, tls://, kafka://, amqp://, amqps://, http://, https://, null://)", redactURL(u), u.Scheme)
		}
	}
	if b.topicTemplate != "" {
		tmpl, err := broker.ParseTemplate(b.topicTemplate)
		if err != nil {
			return nil, usagef("--topic-template: %v", err)
		}
		t.template = &tmpl
	}
	t.streamSubjects = b.natsSubjects
	if len(t.streamSubjects) == 0 && t.template != nil {
		// The template's leading literal tokens, e.g. "events.{aggregate_type}" → "events.>".
		lit, _, _ := strings.Cut(b.topicTemplate, "{")
		prefix := lit[:strings.LastIndexByte(lit, '.')+1]
		if prefix == "" {
			return nil, usagef("--topic-template %q starts with a placeholder: give the stream's subjects with --nats-stream-subjects", b.topicTemplate)
		}
		t.streamSubjects = []string{prefix + ">"}
	}
	if b.ackTimeout <= 0 {
		return nil, usagef("--ack-timeout must be positive, got %s", b.ackTimeout)
	}
	return t, nil
}

// describe names the broker for logs and audit rows, without credentials
// (internal/redact, the one place that knows what a secret looks like).
func (t *brokerTarget) describe() string {
	switch t.kind {
	case "embedded":
		return "embedded (in-process NATS JetStream, " + t.flags.embeddedDir + ")"
	case "null":
		return "null://"
	}
	return showBrokerURL(t.flags.url)
}

// showBrokerURL is the strictest display of a --broker URL (internal/redact's
// Endpoint): a user name is the whole secret of nats://token@host, and only
// kafka://'s query (tls, sasl) is known to hold none.
func showBrokerURL(raw string) string {
	kafkaURL := strings.HasPrefix(strings.ToLower(strings.TrimSpace(raw)), "kafka://")
	if d := redact.Endpoint(raw, kafkaURL); d != "" {
		return d
	}
	return "(broker URL hidden)"
}

// open connects to the broker (starting the embedded one if chosen) and returns
// the publisher and a function that closes everything it opened.
func (t *brokerTarget) open(ctx context.Context, log *slog.Logger) (broker.Publisher, func(), error) {
	warnPlaintextCredentials(log, t.kind, t.flags.url)
	switch t.kind {
	case "null":
		return &null.Publisher{}, func() {}, nil
	case "kafka":
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
	case "rabbitmq":
		cfg := rabbitmq.Config{Exchange: t.flags.amqpExchange, ConfirmTimeout: t.flags.ackTimeout, Logger: log, Encoding: t.encoding}
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
	case "webhook":
		pub, err := webhook.New(&webhook.Config{URL: t.flags.url, Secret: t.secret, AllowUnsigned: t.flags.unsigned,
			Timeout: t.flags.ackTimeout, Logger: log, Encoding: t.encoding})
		if err != nil {
			return nil, nil, usageError{err}
		}
		return pub, func() { _ = pub.Close() }, nil
	}
	cfg := natsbroker.Config{Stream: t.flags.natsStream, StreamSubjects: t.streamSubjects, AckTimeout: t.flags.ackTimeout, Logger: log, Encoding: t.encoding}
	if t.template != nil {
		cfg.Subject = *t.template
	}
	serverURL := t.flags.url
	var embedded *natsembed.Server
	if t.kind == "embedded" {
		var err error
		var serverLog *slog.Logger // the server's own chatter only at --log-level debug
		if log.Enabled(ctx, slog.LevelDebug) {
			serverLog = log.With(slog.String("component", "embedded-nats"))
		}
		embedded, err = natsembed.New(&natsembed.Config{
			StoreDir: t.flags.embeddedDir, Port: t.flags.embeddedPort, Logger: serverLog,
		})
		if err != nil {
			return nil, nil, fmt.Errorf("start embedded NATS server: %w", err)
		}
		serverURL = embedded.URL()
		log.Warn("--broker embedded: events go to a NATS server inside this process; consumers elsewhere never see them, and they are lost with its data directory",
			slog.String("url", serverURL), slog.String("dir", t.flags.embeddedDir))
	}
	pub, err := natsbroker.Dial(ctx, serverURL, &cfg)
	if err != nil {
		if embedded != nil {
			embedded.Shutdown()
		}
		return nil, nil, usageError{err}
	}
	return pub, func() {
		_ = pub.Close()
		if embedded != nil {
			embedded.Shutdown()
		}
	}, nil
}
