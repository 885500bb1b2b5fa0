// Package kinesis publishes outbox events to Amazon Kinesis Data Streams.
//
// Each event becomes one record of the stream its [Config.Stream] template
// names. Kinesis records have no headers, so the record's data is a JSON
// envelope (see [Record]): the Outbox-* headers, the producer's headers and the
// payload, or in the CloudEvents format a structured-mode CloudEvents JSON
// object. The partition key is the event's lane, "aggregate_type/aggregate_id"
// (see [PartitionKey]), so one aggregate's events go to one shard.
//
// Ordering: Kinesis keeps order within a shard, but a PutRecords call that
// fails in part leaves gaps that a retry fills later, out of order. The
// publisher therefore writes each aggregate's records one at a time with
// PutRecord, in sequence order, each with SequenceNumberForOrdering set to the
// sequence number Kinesis returned for the aggregate's previous record in the
// batch, and sends record k+1 only after k was acknowledged. Different
// aggregates are written concurrently (up to [Config.MaxInFlight] requests).
//
// Kinesis has no publish-side deduplication: a record whose acknowledgement
// was lost is written again when the relay retries it. Consumers suppress such
// duplicates by event id in the inbox (package inbox).
//
// Errors: throttling (ProvisionedThroughputExceeded, KMS throttling), 5xx
// answers and network failures are [broker.Unavailable]; refused credentials
// or permissions and a missing stream (ResourceNotFound) are
// [broker.Misconfigured]; a record refused on its own (too large, an invalid
// stream name, a validation error) is [broker.Permanent].
//
// Credentials come only from the AWS SDK's default chain (environment
// variables, shared config and credentials files, web identity, container
// and instance roles), never from the URL. The publisher needs only the
// kinesis:PutRecord permission on its streams; it has no Ping (every
// candidate call needs a permission more), so readiness follows the publishes'
// results.
//
// Outside the standard library it pulls in the AWS SDK for Go v2 (aws-sdk-go-v2
// with its config, credentials and Kinesis service modules, and smithy-go),
// and the root package's pgx and OpenTelemetry trace API.
package kinesis

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Kinesis limits (Amazon Kinesis Data Streams quotas).
const (
	// MaxRecordBytes bounds a record's data plus its partition key, in bytes.
	MaxRecordBytes = 1 << 20
	// MaxPartitionKeyChars bounds a partition key, in Unicode characters.
	MaxPartitionKeyChars = 256
	// maxStreamNameLen bounds a stream name, in bytes.
	maxStreamNameLen = 128
)

// Config configures a Publisher.
type Config struct {
	// Stream names the stream of each event, e.g. "outbox" or
	// "outbox-{aggregate_type}". Required. Every stream it names must exist:
	// a missing one is a configuration error, retried without quarantine.
	Stream broker.Template

	// Encoding selects the record's format; the zero value is the default
	// Outbox-* envelope.
	Encoding wire.Encoding

	// MaxInFlight bounds the PutRecord requests in flight at once, across
	// aggregates. Defaults to 64.
	MaxInFlight int

	// Timeout bounds one PutRecord request, its SDK retries included.
	// Defaults to 30 s.
	Timeout time.Duration
}

// DialConfig is what [Dial] needs beyond Config to build the client.
type DialConfig struct {
	Config

	// HTTPClient, when set, sends the SDK's requests (tests wrap its
	// connections; an *awshttp.BuildableClient keeps the SDK's handling of
	// AWS_CA_BUNDLE). Defaults to the SDK's client.
	HTTPClient aws.HTTPClient
}

// Publisher publishes to Kinesis. It is safe for concurrent use.
type Publisher struct {
	client *kinesis.Client
	cfg    Config
	sem    chan struct{}
}

// New returns a publisher that writes through client, a ready-made Kinesis
// client (its credentials, region and retries are the caller's).
func New(client *kinesis.Client, cfg *Config) (*Publisher, error) {
	if client == nil {
		return nil, errors.New("kinesis: nil client")
	}
	c := *cfg
	if c.Stream.String() == "" {
		return nil, errors.New("kinesis: no stream: Config.Stream (or the URL's kinesis://<stream>) is required")
	}
	if err := CheckTemplate(c.Stream); err != nil {
		return nil, err
	}
	if err := c.Encoding.Validate(); err != nil {
		return nil, fmt.Errorf("kinesis: Config.Encoding: %w", err)
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 64
	}
	if c.Timeout <= 0 {
		c.Timeout = 30 * time.Second
	}
	return &Publisher{client: client, cfg: c, sem: make(chan struct{}, c.MaxInFlight)}, nil
}

// Dial parses rawURL (see [ParseURL]), builds a client from the AWS default
// credential chain and returns a publisher. cfg.Stream, when set, overrides
// the URL's stream template; one of them must name the stream. It does not
// contact Kinesis.
func Dial(ctx context.Context, rawURL string, cfg *DialConfig) (*Publisher, error) {
	u, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	c := cfg.Config
	if c.Stream.String() == "" {
		c.Stream = u.Stream
	}
	opts := []func(*config.LoadOptions) error{
		config.WithRetryer(func() aws.Retryer {
			// Few quick retries: the relay retries with its own backoff, and a
			// retry quota would turn an outage into an unclassified error.
			return retry.NewStandard(func(o *retry.StandardOptions) {
				o.MaxAttempts = 3
				o.RateLimiter = ratelimit.None
			})
		}),
	}
	if u.Region != "" {
		opts = append(opts, config.WithRegion(u.Region))
	}
	if cfg.HTTPClient != nil {
		opts = append(opts, config.WithHTTPClient(cfg.HTTPClient))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("kinesis: load the AWS configuration: %w", err)
	}
	if awsCfg.Region == "" {
		return nil, errors.New("kinesis: no AWS region: set ?region= in the URL or AWS_REGION")
	}
	client := kinesis.NewFromConfig(awsCfg, func(o *kinesis.Options) {
		if u.Endpoint != "" {
			o.BaseEndpoint = aws.String(u.Endpoint)
		}
	})
	return New(client, &c)
}

// PartitionKey returns the partition key of m: its lane,
// "aggregate_type/aggregate_id", when that has at most 256 Unicode characters
// (Kinesis's limit); otherwise "sha256:" and the lane's SHA-256 in hex. Both
// keep one aggregate on one shard.
func PartitionKey(m *broker.Message) string {
	lane := m.Lane().String()
	if utf8.RuneCountInString(lane) <= MaxPartitionKeyChars {
		return lane
	}
	sum := sha256.Sum256([]byte(lane))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Publish writes msgs, one result per message (see the package doc for the
// ordering rule and how errors are classified).
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []error {
	var mu sync.Mutex
	last := map[string]string{} // partition key → sequence number of its last record in this batch
	return broker.PublishLanes(ctx, msgs, func(ctx context.Context, m *broker.Message) (broker.AckFunc, error) {
		in, err := p.input(m)
		if err != nil {
			return nil, err
		}
		select {
		case p.sem <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return func(ctx context.Context) error {
			defer func() { <-p.sem }()
			key := *in.PartitionKey
			mu.Lock()
			if seq, ok := last[key]; ok {
				in.SequenceNumberForOrdering = aws.String(seq)
			}
			mu.Unlock()
			ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
			defer cancel()
			out, err := p.client.PutRecord(ctx, in)
			if err != nil {
				return classify(fmt.Errorf("kinesis: put event %s into stream %q: %w", m.EventID, *in.StreamName, err))
			}
			if out.SequenceNumber != nil {
				mu.Lock()
				last[key] = *out.SequenceNumber
				mu.Unlock()
			}
			return nil
		}, nil
	})
}

// input builds m's PutRecord request, or says why m cannot be sent, marked
// Permanent.
func (p *Publisher) input(m *broker.Message) (*kinesis.PutRecordInput, error) {
	refuse := func(err error) error { return broker.Permanent(fmt.Errorf("kinesis: event %s: %w", m.EventID, err)) }
	stream, err := p.cfg.Stream.ExpandChecked(m)
	if err == nil {
		err = CheckStreamName(stream)
	}
	if err != nil {
		return nil, refuse(err)
	}
	data, err := Encode(p.cfg.Encoding, m)
	if err != nil {
		return nil, refuse(err)
	}
	key := PartitionKey(m)
	if n := len(data) + len(key); n > MaxRecordBytes {
		return nil, refuse(fmt.Errorf("the record is %d bytes (data and partition key), above Kinesis's limit of %d", n, MaxRecordBytes))
	}
	return &kinesis.PutRecordInput{StreamName: aws.String(stream), PartitionKey: aws.String(key), Data: data}, nil
}

// Close releases nothing: the SDK's client holds idle connections only.
func (p *Publisher) Close() error { return nil }

// CheckStreamName reports why name cannot be a Kinesis stream name: 1 to 128
// characters of a-z, A-Z, 0-9, '_', '.' and '-'.
func CheckStreamName(name string) error {
	if name == "" || len(name) > maxStreamNameLen {
		return fmt.Errorf("stream name of %d bytes: want 1 to %d", len(name), maxStreamNameLen)
	}
	for i := 0; i < len(name); i++ {
		if !streamNameByte(name[i]) {
			return fmt.Errorf("stream name %q: character %q not allowed (want a-z, A-Z, 0-9, '_', '.', '-')", name, name[i])
		}
	}
	return nil
}

func streamNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-'
}

// CheckTemplate refuses a stream template whose literal text could never be
// part of a stream name.
func CheckTemplate(t broker.Template) error {
	lit := t.ExpandFunc(func(string) string { return "x" })
	if err := CheckStreamName(lit); err != nil {
		return fmt.Errorf("kinesis: stream template %q: %w", t.String(), err)
	}
	return nil
}
