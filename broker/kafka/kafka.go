// Package kafka publishes outbox events to Apache Kafka (and Kafka-compatible
// brokers such as Redpanda) with franz-go.
//
// Each event becomes one record: the topic expanded from [Config.Topic], the
// aggregate id as the key, the payload as the value and the wire headers
// (docs/design.md, "Wire headers") as record headers. The key puts every event of an aggregate in one partition, the
// only place Kafka orders records. Records are written by an idempotent producer
// with acks=all: an ack means every in-sync replica has the record, and the
// producer's own retries never store a record twice.
//
// Within an aggregate the next event leaves only after the previous one's ack
// ([broker.PublishLanes]); events of different aggregates are all in flight
// together and share produce requests. Why not pipeline an aggregate's events, as
// Kafka's idempotent producer might allow, is explained at [Publisher.Publish].
//
// [New] wraps a client the caller configured; [Dial] builds and owns one from a
// kafka:// URL ([ParseURL]) and reconnects forever: a cluster that is unreachable
// at start-up is not an error, publishes fail as [broker.Unavailable] until it is
// reachable.
//
// Outside the standard library it pulls in franz-go (with klauspost/compress and
// pierrec/lz4), besides the root package's pgx and OpenTelemetry trace API.
package kafka

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/kafkalog"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Defaults of Config.
const (
	// DefaultTopic is the topic template when Config.Topic is unset.
	DefaultTopic = "outbox.{aggregate_type}"
	// DefaultProduceTimeout is the wait for one record's ack when
	// Config.ProduceTimeout is zero.
	DefaultProduceTimeout = 30 * time.Second
)

// Config configures a Publisher. A nil *Config means all defaults.
type Config struct {
	// Topic is the template of each event's topic. A topic that is not a legal
	// Kafka topic name (for instance, an aggregate type with a space) fails the
	// event as a permanent refusal. Unset means DefaultTopic
	// ("outbox.{aggregate_type}").
	Topic broker.Template

	// ProduceTimeout bounds the wait for the ack of one record; a record without
	// an ack by then fails as unavailable (it may still be stored, and a retry is
	// then a duplicate). Dial also makes it the client's record delivery timeout
	// (kgo.RecordDeliveryTimeout), after which the client stops retrying a record
	// it has not sent, or whose fate the broker has told it. Zero means
	// DefaultProduceTimeout (30s).
	ProduceTimeout time.Duration

	// Logger receives the publisher's warnings and, for Dial, the client's
	// warnings and errors (and its informational lines when the handler is
	// enabled for debug). Nil means slog.Default().
	Logger *slog.Logger

	// TLS, when set, makes Dial connect with TLS using this configuration,
	// whatever the URL says; tls=true in the URL without it uses the system's
	// root certificates. New ignores it. Nil means no TLS.
	TLS *tls.Config

	// SASL, when its Mechanism is set, makes Dial authenticate with it. Setting
	// it and also giving credentials in the URL is an error. New ignores it.
	// The zero value means no authentication.
	SASL SASL

	// DialOptions are extra client options for Dial (a custom dialer, hooks,
	// kgo.ProducerBatchMaxBytes, …); they are applied after the publisher's own,
	// so they win. They must keep the producer idempotent with acks=all. New
	// ignores them. Empty means none.
	DialOptions []kgo.Opt

	// Encoding is the wire format of the records. The zero value is the default
	// Outbox-* headers; FormatCloudEvents sends CloudEvents binary mode per the
	// Kafka protocol binding (ce_* headers, a content-type header).
	Encoding wire.Encoding
}

// SASL is how the publisher authenticates to the cluster.
type SASL struct {
	// Mechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (as Kafka spells them;
	// case does not matter). Empty means no SASL.
	Mechanism string
	// User and Password are the credentials. PLAIN sends them as they are, so
	// use it only with TLS.
	User     string
	Password string
}

// SASL mechanism names, as Kafka spells them.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// String describes s without its password, so that printing a Config (with %v
// or %+v) cannot leak it.
func (s SASL) String() string {
	if s.Mechanism == "" && s.User == "" && s.Password == "" {
		return "none"
	}
	pw := ""
	if s.Password != "" {
		pw = ", password redacted"
	}
	return fmt.Sprintf("%s as %q%s", s.Mechanism, s.User, pw)
}

// GoString is String for %#v.
func (s SASL) GoString() string { return "kafka.SASL{" + s.String() + "}" }

// LogValue is String for log/slog.
func (s SASL) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalJSON encodes String, not the password: slog's JSON handler encodes a
// Config logged as a whole with encoding/json.
func (s SASL) MarshalJSON() ([]byte, error) { return json.Marshal(s.String()) }

// mechanism checks s and returns its franz-go form, nil for no SASL.
func (s SASL) mechanism() (canonical string, err error) {
	switch canonical = normalizeMechanism(s.Mechanism); canonical {
	case "":
		if s.User != "" || s.Password != "" {
			return "", errors.New("Config.SASL: credentials without a Mechanism (want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)")
		}
		return "", nil
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		if s.User == "" {
			return "", fmt.Errorf("Config.SASL.User: empty for mechanism %s", canonical)
		}
		return canonical, nil
	default:
		return "", fmt.Errorf("Config.SASL.Mechanism %q: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", s.Mechanism)
	}
}

func normalizeMechanism(m string) string {
	for _, known := range []string{SASLPlain, SASLScramSHA256, SASLScramSHA512} {
		if strings.EqualFold(m, known) {
			return known
		}
	}
	return m
}

// Validate reports every invalid field of c — a Topic whose literal text no
// topic name allows, a negative ProduceTimeout, an incomplete SASL, an
// unusable Encoding — each error naming its field. Zero fields stand for their
// defaults, and a nil c (all defaults) is valid.
func (c *Config) Validate() error {
	_, err := withDefaults(c)
	return err
}

// withDefaults returns a copy of cfg (nil means all defaults) with defaults
// applied, or the errors of Validate.
func withDefaults(cfg *Config) (Config, error) {
	return config.Resolve("kafka", cfg, fillDefaults, checkConfig)
}

func fillDefaults(c *Config) {
	if c.Topic.String() == "" {
		c.Topic = broker.MustParseTemplate(DefaultTopic)
	}
	config.Default(&c.ProduceTimeout, DefaultProduceTimeout)
	config.Default(&c.Logger, slog.Default())
	c.DialOptions = slices.Clone(c.DialOptions)
}

func checkConfig(c *Config, p *config.Problems) {
	// The template's literal text must be legal in a topic name; placeholders
	// are checked per event. A sample expansion finds bad literals at start-up.
	sample := broker.Message{AggregateType: "a", AggregateID: "a", EventType: "a", SchemaVersion: 1, Tenant: "a"}
	p.Field(fmt.Sprintf("Config.Topic (%q)", c.Topic.String()), validateTopic(c.Topic.Expand(&sample)))
	p.Check(c.ProduceTimeout > 0, "Config.ProduceTimeout (%s) must be positive", c.ProduceTimeout)
	if _, err := c.SASL.mechanism(); err != nil {
		p.Check(false, "%w", err)
	}
	p.Field("Config.Encoding", c.Encoding.Validate())
}

// Publisher publishes outbox events to Kafka. It implements [broker.Publisher]
// and [broker.Pinger] and is safe for concurrent use.
type Publisher struct {
	cfg  Config
	cl   *kgo.Client
	owns bool // Close closes cl (Dial)

	closeOnce sync.Once
	closed    chan struct{}

	// Dial's start-up check of the cluster, stopped by Close.
	stopCheck context.CancelFunc
	checking  sync.WaitGroup
}

var errClosed = errors.New("kafka: publisher closed")

// New returns a publisher on client, configured by cfg (nil means all
// defaults). The caller configured client and keeps owning it: Close does not
// close it. The publisher sets each record's topic, key and headers, so
// client's default topic is not used.
//
// client must be an idempotent producer with acks=all, franz-go's defaults: New
// returns an error if it was built with kgo.DisableIdempotentWrite,
// kgo.AllowIdempotentProduceCancellation, kgo.RequiredAcks other than
// kgo.AllISRAcks, kgo.TransactionalID or kgo.ManualFlushing. Its partitioner must
// hash record keys, as franz-go's default and kgo.StickyKeyPartitioner do, so
// that an aggregate stays in one partition. Topics are created on first use
// only if it was built with kgo.AllowAutoTopicCreation and the broker allows it.
// Give it a kgo.RecordDeliveryTimeout near Config.ProduceTimeout, so that records
// the publisher gave up on do not stay buffered for ever, and
// kgo.ProducerLinger(0): lingering delays every step of an aggregate's lane (see
// [Publisher.Publish]).
func New(client *kgo.Client, cfg *Config) (*Publisher, error) {
	if client == nil {
		return nil, errors.New("kafka: New: nil client")
	}
	c, err := withDefaults(cfg)
	if err != nil {
		return nil, err
	}
	if err := checkClient(client); err != nil {
		return nil, fmt.Errorf("kafka: New: %w", err)
	}
	return newPublisher(client, c, false), nil
}

// checkClient refuses a client that would break the ordering or ack guarantees.
func checkClient(cl *kgo.Client) error {
	if acks, _ := cl.OptValue(kgo.RequiredAcks).(kgo.Acks); acks != kgo.AllISRAcks() {
		return errors.New("the client must require acks from all in-sync replicas (kgo.RequiredAcks(kgo.AllISRAcks()))")
	}
	for _, refused := range []struct {
		opt  any
		name string
	}{
		{kgo.DisableIdempotentWrite, "kgo.DisableIdempotentWrite: without idempotence a retried produce can store a record twice, out of order"},
		{kgo.AllowIdempotentProduceCancellation, "kgo.AllowIdempotentProduceCancellation: it lets a cancelled record be stored after the records behind it"},
		{kgo.ManualFlushing, "kgo.ManualFlushing: records would wait for a Flush that the publisher never calls"},
	} {
		if on, _ := cl.OptValue(refused.opt).(bool); on {
			return fmt.Errorf("the client was built with %s", refused.name)
		}
	}
	if vs := cl.OptValues(kgo.TransactionalID); len(vs) == 2 && vs[1] == true {
		return errors.New("the client is transactional (kgo.TransactionalID); the publisher produces outside transactions")
	}
	return nil
}

// Dial returns a publisher that owns a client connected to the cluster at url, a
// kafka:// URL ([ParseURL] gives its syntax); Config.TLS, Config.SASL and Config.DialOptions
// add to what the URL says. A malformed url or an invalid Config is an error; an
// unreachable cluster is not: publishes fail as [broker.Unavailable] until it is
// reachable. Dial does not wait for the cluster; ctx bounds a check, in the
// background, whose only effect is a log line saying whether a broker answered.
//
// The client is an idempotent producer with acks=all, partitions records by the
// murmur2 hash of their key as Kafka's Java client does (so other producers of
// the same topics agree on an aggregate's partition), retries without limit
// within Config.ProduceTimeout, does not linger, and asks the broker to create
// missing topics (the broker's auto.create.topics.enable decides).
func Dial(ctx context.Context, url string, config *Config) (*Publisher, error) {
	u, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	var cfg Config // what the caller asked for, then what the URL adds
	if config != nil {
		cfg = *config
	}
	if u.SASL.Mechanism != "" {
		if cfg.SASL.Mechanism != "" || cfg.SASL.User != "" || cfg.SASL.Password != "" {
			return nil, errors.New("kafka: credentials are given both in the URL and in Config.SASL; give them once")
		}
		cfg.SASL = u.SASL
	}
	if u.TLS && cfg.TLS == nil {
		cfg.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	cfg, err = withDefaults(&cfg)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger

	opts := []kgo.Opt{
		kgo.SeedBrokers(u.SeedBrokers...),
		kgo.ClientID("pgoutbox"),
		kgo.WithLogger(kafkalog.New(log)),
		// franz-go's defaults, spelled out because the guarantees rest on them.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		// Retries are unlimited (franz-go's default) but bounded in time: a record
		// that cannot be delivered within ProduceTimeout fails, together with the
		// records behind it in its partition, once that is safe (see Publish).
		kgo.RecordDeliveryTimeout(cfg.ProduceTimeout),
		// An aggregate's next event waits for the previous ack, so a linger would
		// be paid at every step of a lane. Records still share requests: whatever
		// is buffered while a request is in flight goes out in the next one.
		kgo.ProducerLinger(0),
		kgo.AllowAutoTopicCreation(),
	}
	if cfg.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(cfg.TLS.Clone()))
	}
	mech, _ := cfg.SASL.mechanism() // validated by withDefaults
	switch mech {
	case SASLPlain:
		if cfg.TLS == nil {
			log.Warn("kafka: SASL PLAIN without TLS sends the password in clear text")
		}
		opts = append(opts, kgo.SASL(plain.Auth{User: cfg.SASL.User, Pass: cfg.SASL.Password}.AsMechanism()))
	case SASLScramSHA256:
		opts = append(opts, kgo.SASL(scram.Auth{User: cfg.SASL.User, Pass: cfg.SASL.Password}.AsSha256Mechanism()))
	case SASLScramSHA512:
		opts = append(opts, kgo.SASL(scram.Auth{User: cfg.SASL.User, Pass: cfg.SASL.Password}.AsSha512Mechanism()))
	}
	cl, err := kgo.NewClient(append(opts, cfg.DialOptions...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka: client: %w", err)
	}
	if err := checkClient(cl); err != nil {
		cl.Close()
		return nil, fmt.Errorf("kafka: Config.DialOptions: %w", err)
	}
	p := newPublisher(cl, cfg, true)
	// Whether the cluster answers is only worth a log line: waiting for it here
	// would hold up a relay's start-up (up to a dial timeout per seed broker when
	// packets are dropped) for nothing, as publishes wait for it anyway.
	checkCtx, cancel := context.WithCancel(ctx)
	p.stopCheck = cancel
	p.checking.Add(1)
	go func() {
		defer p.checking.Done()
		defer cancel()
		if err := cl.Ping(checkCtx); err != nil {
			if checkCtx.Err() == nil {
				log.Warn("kafka: cluster not reachable yet; publishes fail as unavailable until it is",
					slog.String("url", u.String()), slog.Any("error", err))
			}
			return
		}
		log.Info("kafka: cluster reachable", slog.String("url", u.String()))
	}()
	return p, nil
}

func newPublisher(cl *kgo.Client, cfg Config, owns bool) *Publisher {
	return &Publisher{cfg: cfg, cl: cl, owns: owns, closed: make(chan struct{})}
}

// Publish publishes msgs and returns one result per message; see
// [broker.Publisher]. ctx bounds the whole call, but not the records already
// handed to the client: those the call gave up on may still be stored, which the
// relay's retry then duplicates (never reorders, see below).
//
// Within an aggregate, a message is produced only after the previous one's ack
// ([broker.PublishLanes]). Kafka's idempotent producer would keep the order of
// several records of one partition in flight even if one fails, and franz-go
// backs that up within its buffer: when a record fails, every record buffered
// behind it in the partition fails too (kgo.RecordRetries and
// kgo.RecordDeliveryTimeout say so; sink.go's failAllRecords does it). But that
// only covers records that were buffered before the failure. franz-go reports a
// failure to the producer later, from its promise goroutine, so a record
// produced in between starts a fresh sequence and is stored without its
// predecessor; and a record the client refuses before buffering it (larger than
// kgo.ProducerBatchMaxBytes) fails alone, without failing the records behind it.
// Pipelining k+1 behind k would then store k+1 with k missing, which no
// re-publish can repair (the maintainers confirm the race in franz-go issue
// #852). Waiting for k's ack costs a round trip per event of one aggregate only;
// unrelated aggregates still share every produce request.
//
// The lane rule also keeps failures local: a record's context is never the
// caller's ctx, because franz-go cancels a partition's whole buffer, other
// calls' records included, when the first record's context ends.
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []error {
	if len(msgs) == 0 {
		return []error{}
	}
	select {
	case <-p.closed:
		return broker.FailAll(msgs, broker.Unavailable(errClosed))
	default:
	}
	return broker.PublishLanes(ctx, msgs, p.send)
}

// send hands m's record to the client and returns how to wait for its ack. It
// never blocks: when the client's buffer is full (kgo.MaxBufferedRecords), the
// message fails as unavailable rather than wait in a Produce that ctx cannot
// interrupt.
func (p *Publisher) send(_ context.Context, m *broker.Message) (broker.AckFunc, error) {
	enc, err := p.cfg.Encoding.Encode(m, wire.CloudEventsKafka)
	if err != nil {
		return nil, err
	}
	topic, err := p.cfg.Topic.ExpandChecked(m)
	if err != nil {
		return nil, broker.Permanent(fmt.Errorf("kafka: event %s: %w", m.EventID, err))
	}
	if err := validateTopic(topic); err != nil {
		return nil, broker.Permanent(fmt.Errorf("kafka: event %s: %w", m.EventID, err))
	}
	select {
	case <-p.closed:
		return nil, broker.Unavailable(errClosed)
	default:
	}
	rec := &kgo.Record{
		Topic:   topic,
		Key:     []byte(m.AggregateID),
		Value:   enc.Body,
		Headers: recordHeaders(enc),
		// The timestamp is left to the client (now): the broker applies
		// retention and timestamp checks to it, so an old event re-published by
		// replay must not carry its occurred_at there. That is in a header.
	}
	done := make(chan error, 1) // the promise must never block
	p.cl.TryProduce(context.Background(), rec, func(_ *kgo.Record, err error) { done <- err })
	return func(ctx context.Context) error {
		timer := time.NewTimer(p.cfg.ProduceTimeout)
		defer timer.Stop()
		select {
		case err := <-done:
			if err != nil {
				return fmt.Errorf("kafka: produce event %s to %s: %w", m.EventID, topic, classify(err))
			}
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
			return broker.Unavailable(fmt.Errorf("kafka: produce event %s to %s: no ack within %s", m.EventID, topic, p.cfg.ProduceTimeout))
		case <-p.closed:
			return broker.Unavailable(errClosed)
		}
	}, nil
}

// recordHeaders returns enc's headers sorted by name, so that equal events are
// equal records. Kafka records have no content-type field: the CloudEvents
// binding carries it as a header, the default format leaves it out.
func recordHeaders(enc wire.Encoded) []kgo.RecordHeader {
	out := make([]kgo.RecordHeader, 0, enc.HeaderCount)
	for k, v := range enc.Headers {
		out = append(out, kgo.RecordHeader{Key: k, Value: []byte(v)})
	}
	slices.SortFunc(out, func(a, b kgo.RecordHeader) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// Ping reports whether a broker of the cluster answers. ctx bounds the check.
// Its errors are marked [broker.Unavailable].
func (p *Publisher) Ping(ctx context.Context) error {
	select {
	case <-p.closed:
		return broker.Unavailable(errClosed)
	default:
	}
	if err := p.cl.Ping(ctx); err != nil {
		return broker.Unavailable(fmt.Errorf("kafka: ping: %w", err))
	}
	return nil
}

// Close fails in-flight publishes and, for a publisher from Dial, closes its
// client (records it still buffers fail; some may have been stored). It is safe
// to call more than once.
func (p *Publisher) Close() error {
	p.closeOnce.Do(func() {
		close(p.closed)
		if p.stopCheck != nil {
			p.stopCheck()
		}
		p.checking.Wait()
		if p.owns {
			p.cl.Close()
		}
	})
	return nil
}

var (
	_ broker.Publisher = (*Publisher)(nil)
	_ broker.Pinger    = (*Publisher)(nil)
)
