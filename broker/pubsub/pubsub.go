// Package pubsub publishes outbox events to Google Cloud Pub/Sub.
//
// Each event becomes one Pub/Sub message on the topic its [Config.Topic]
// template names (default [DefaultTopic]). The message data is the payload,
// unchanged; the Outbox-* headers and the producer's headers travel as message
// attributes. In the CloudEvents format the message follows the CloudEvents
// Pub/Sub protocol binding in binary mode: every attribute as a "ce-" prefixed
// message attribute and datacontenttype as the "Content-Type" attribute.
//
// Ordering: the publisher enables message ordering, and each message's
// ordering key is the event's lane, "aggregate_type/aggregate_id" (see
// [OrderingKey]), so a subscription with message ordering enabled delivers one
// aggregate's events in order. Within a batch, an aggregate's message k+1 is
// published only after k was acknowledged ([broker.PublishLanes]); aggregates
// are published concurrently. After a publish error on an ordering key, the
// Pub/Sub client pauses the key and fails everything queued behind it; the
// publisher reports the rest of the aggregate's messages as
// [broker.ErrPredecessorFailed] and resumes the key before it publishes on it
// again, so the relay's retry goes through.
//
// Pub/Sub has no publish-side deduplication: a message whose acknowledgement
// was lost is stored again when the relay retries it. The event id travels in
// the Outbox-Event-Id attribute (ce-id in the CloudEvents format), and
// consumers drop such duplicates in the inbox (package inbox).
//
// Limits are checked before publishing, and a message beyond one is refused
// as [broker.Permanent], never truncated: a topic ID of 3 to 255 characters
// of [A-Za-z0-9-_.~+%] starting with a letter and not with "goog"; at most
// 100 attributes, each key at most 256 bytes (not starting with "goog") and
// each value at most 1024 bytes; a message of at most 10 MB.
//
// Errors: Unavailable, DeadlineExceeded, ResourceExhausted, Internal and
// Aborted answers and network failures are [broker.Unavailable];
// PermissionDenied, Unauthenticated and NotFound (a missing topic) are
// [broker.Misconfigured]; InvalidArgument is [broker.Permanent].
//
// Credentials come only from Application Default Credentials
// (GOOGLE_APPLICATION_CREDENTIALS naming a key file, gcloud's, or the
// metadata server), never from the URL or a flag. With the URL's endpoint, or
// PUBSUB_EMULATOR_HOST as the client library reads it, the publisher talks to
// an emulator in plaintext without credentials. The publisher needs only the
// pubsub.topics.publish permission (roles/pubsub.publisher); it has no Ping
// (every other call needs a permission more), so readiness follows the
// publishes' results.
//
// Outside the standard library it pulls in the Cloud Pub/Sub client
// (cloud.google.com/go/pubsub/v2, with google.golang.org/api, gRPC and
// protobuf), and the root package's pgx and OpenTelemetry trace API.
package pubsub

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/proto"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Pub/Sub limits (Google Cloud Pub/Sub quotas and resource limits).
const (
	// MaxMessageBytes bounds a message: data, attributes and ordering key as
	// the publish request encodes them.
	MaxMessageBytes = 10_000_000
	// MaxAttributes bounds the attributes of a message.
	MaxAttributes = 100
	// MaxAttributeKeyBytes bounds an attribute's key.
	MaxAttributeKeyBytes = 256
	// MaxAttributeValueBytes bounds an attribute's value.
	MaxAttributeValueBytes = 1024
	// MaxOrderingKeyBytes bounds an ordering key.
	MaxOrderingKeyBytes = 1024
)

// DefaultTopic is the topic template when Config.Topic is not set.
const DefaultTopic = "outbox.{aggregate_type}"

// ContentTypeAttribute carries datacontenttype in the CloudEvents format, as
// the CloudEvents Pub/Sub binding names it.
const ContentTypeAttribute = "Content-Type"

// CloudEventsPubSub is the CloudEvents Pub/Sub protocol binding in binary
// mode: "ce-" attributes and a Content-Type attribute.
var CloudEventsPubSub = wire.CloudEventsBinding{Prefix: "ce-", ContentTypeHeader: ContentTypeAttribute}

// Config configures a Publisher.
type Config struct {
	// Topic names the topic ID of each event, e.g. "outbox" or
	// "outbox.{aggregate_type}". Defaults to [DefaultTopic]. Every topic it
	// names must exist: a missing one is a configuration error, retried
	// without quarantine.
	Topic broker.Template

	// Encoding selects the message format; the zero value is the default
	// Outbox-* attributes.
	Encoding wire.Encoding

	// Timeout bounds one publish, the client's retries included. Defaults to
	// 30 s.
	Timeout time.Duration

	// MaxTopics bounds the topics the publisher keeps a sender for at once;
	// an idle one is let go when a new topic would exceed it. Defaults to 1024.
	MaxTopics int
}

// Publisher publishes to Pub/Sub. It is safe for concurrent use.
type Publisher struct {
	client *pubsub.Client
	cfg    Config
	own    bool // Close closes client

	mu     sync.Mutex
	topics map[string]*topic
	paused map[string]bool // topic ID + "\x00" + ordering key, to resume before the next publish
	closed bool
}

// topic is the client's sender of one topic and how many publishes use it.
type topic struct {
	pub  *pubsub.Publisher
	refs int
}

// New returns a publisher that writes through client, a ready-made Pub/Sub
// client (its project, credentials and endpoint are the caller's, and so is
// closing it). cfg nil means all defaults.
func New(client *pubsub.Client, cfg *Config) (*Publisher, error) {
	if client == nil {
		return nil, errors.New("pubsub: nil client")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Topic.String() == "" {
		t, err := broker.ParseTemplate(DefaultTopic)
		if err != nil {
			return nil, err
		}
		c.Topic = t
	}
	if err := CheckTemplate(c.Topic); err != nil {
		return nil, err
	}
	if err := c.Encoding.Validate(); err != nil {
		return nil, fmt.Errorf("pubsub: Config.Encoding: %w", err)
	}
	if c.Timeout <= 0 {
		c.Timeout = 30 * time.Second
	}
	if c.MaxTopics <= 0 {
		c.MaxTopics = 1024
	}
	return &Publisher{client: client, cfg: c, topics: map[string]*topic{}, paused: map[string]bool{}}, nil
}

// Dial parses rawURL (see [ParseURL]), builds a client with Application
// Default Credentials (or none, for an emulator) and returns a publisher that
// closes it. cfg.Topic, when set, overrides the URL's topic template. It does
// not contact Pub/Sub.
func Dial(ctx context.Context, rawURL string, cfg *Config) (*Publisher, error) {
	u, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Topic.String() == "" {
		c.Topic = u.Topic
	}
	client, err := u.NewClient(ctx)
	if err != nil {
		return nil, err
	}
	p, err := New(client, &c)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	p.own = true
	return p, nil
}

// OrderingKey returns the ordering key of m: its lane,
// "aggregate_type/aggregate_id", when that has at most 1024 bytes (Pub/Sub's
// limit); otherwise "sha256:" and the lane's SHA-256 in hex. Both keep one
// aggregate's messages in order.
func OrderingKey(m *broker.Message) string {
	lane := m.Lane().String()
	if len(lane) <= MaxOrderingKeyBytes {
		return lane
	}
	sum := sha256.Sum256([]byte(lane))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Publish publishes msgs, one result per message (see the package doc for
// the ordering rule and how errors are classified).
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []error {
	return broker.PublishLanes(ctx, msgs, func(ctx context.Context, m *broker.Message) (broker.AckFunc, error) {
		topicID, msg, err := p.message(m)
		if err != nil {
			return nil, err
		}
		t, err := p.acquire(topicID)
		if err != nil {
			return nil, err
		}
		pausedKey := topicID + "\x00" + msg.OrderingKey
		p.mu.Lock()
		if p.paused[pausedKey] {
			// An earlier publish on this key failed: the relay retries it now.
			t.pub.ResumePublish(msg.OrderingKey)
			delete(p.paused, pausedKey)
		}
		p.mu.Unlock()
		res := t.pub.Publish(ctx, msg)
		return func(ctx context.Context) error {
			defer p.release(topicID)
			_, err := res.Get(ctx)
			if err == nil {
				return nil
			}
			select {
			case <-res.Ready():
				// The client failed the message and paused its key.
				p.mu.Lock()
				p.paused[pausedKey] = true
				p.mu.Unlock()
			default: // ctx ended first; a failure to come shows as ErrPublishingPaused
			}
			return classify(fmt.Errorf("pubsub: publish event %s to topic %q: %w", m.EventID, topicID, err))
		}, nil
	})
}

// message builds m's Pub/Sub message and names its topic, or says why m
// cannot be sent, marked Permanent.
func (p *Publisher) message(m *broker.Message) (string, *pubsub.Message, error) {
	refuse := func(err error) error { return broker.Permanent(fmt.Errorf("pubsub: event %s: %w", m.EventID, err)) }
	topicID, err := p.cfg.Topic.ExpandChecked(m)
	if err == nil {
		err = CheckTopicID(topicID)
	}
	if err != nil {
		return "", nil, refuse(err)
	}
	enc, err := p.cfg.Encoding.Encode(m, CloudEventsPubSub)
	if err != nil {
		return "", nil, refuse(err)
	}
	attrs := make(map[string]string, enc.HeaderCount)
	for k, v := range enc.Headers {
		attrs[k] = v
	}
	if err := CheckAttributes(attrs); err != nil {
		return "", nil, refuse(err)
	}
	msg := &pubsub.Message{Data: enc.Body, Attributes: attrs, OrderingKey: OrderingKey(m)}
	if n := proto.Size(&pubsubpb.PubsubMessage{Data: msg.Data, Attributes: attrs, OrderingKey: msg.OrderingKey}); n > MaxMessageBytes {
		return "", nil, refuse(fmt.Errorf("the message is %d bytes (data, attributes and ordering key), above Pub/Sub's limit of %d", n, MaxMessageBytes))
	}
	return topicID, msg, nil
}

// acquire returns the sender of topicID, making it when needed.
func (p *Publisher) acquire(topicID string) (*topic, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("pubsub: publisher closed")
	}
	t, ok := p.topics[topicID]
	if !ok {
		if len(p.topics) >= p.cfg.MaxTopics {
			p.evictIdleLocked()
		}
		pub := p.client.Publisher(topicID)
		pub.EnableMessageOrdering = true
		pub.PublishSettings.Timeout = p.cfg.Timeout
		// Within a lane one message is in flight at a time: waiting to fill a
		// bundle would only add latency.
		pub.PublishSettings.DelayThreshold = time.Millisecond
		t = &topic{pub: pub}
		p.topics[topicID] = t
	}
	t.refs++
	return t, nil
}

func (p *Publisher) release(topicID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t, ok := p.topics[topicID]; ok {
		t.refs--
	}
}

// evictIdleLocked lets go of the senders no publish uses. Their keys' pauses
// go with them: a new sender starts unpaused.
func (p *Publisher) evictIdleLocked() {
	for id, t := range p.topics {
		if t.refs == 0 {
			go t.pub.Stop() // nothing is pending: returns at once
			delete(p.topics, id)
			for k := range p.paused {
				if strings.HasPrefix(k, id+"\x00") {
					delete(p.paused, k)
				}
			}
		}
	}
}

// Close stops the topics' senders (waiting for what they hold) and, when
// Dial made the client, closes it.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	topics := p.topics
	p.topics = map[string]*topic{}
	p.mu.Unlock()
	for _, t := range topics {
		t.pub.Stop()
	}
	if p.own {
		if err := p.client.Close(); err != nil {
			return fmt.Errorf("pubsub: close the client: %w", err)
		}
	}
	return nil
}

// CheckTopicID reports why id cannot be a Pub/Sub topic ID: 3 to 255
// characters of A-Z, a-z, 0-9 and -_.~+%, starting with a letter and not
// with "goog".
func CheckTopicID(id string) error {
	if len(id) < 3 || len(id) > 255 {
		return fmt.Errorf("topic ID of %d bytes: want 3 to 255", len(id))
	}
	if c := id[0]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
		return fmt.Errorf("topic ID %q: must start with a letter", id)
	}
	if strings.HasPrefix(strings.ToLower(id), "goog") {
		return fmt.Errorf("topic ID %q: must not start with \"goog\"", id)
	}
	for i := 0; i < len(id); i++ {
		if !topicByte(id[i]) {
			return fmt.Errorf("topic ID %q: character %q not allowed (want A-Z, a-z, 0-9, -_.~+%%)", id, id[i])
		}
	}
	return nil
}

func topicByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-_.~+%", c) >= 0
}

// CheckTemplate refuses a topic template whose literal text could never be
// part of a topic ID.
func CheckTemplate(t broker.Template) error {
	lit := t.ExpandFunc(func(string) string { return "x" })
	if err := CheckTopicID(lit); err != nil {
		return fmt.Errorf("pubsub: topic template %q: %w", t.String(), err)
	}
	return nil
}

// CheckAttributes reports why attrs cannot be a Pub/Sub message's
// attributes: more than 100, an empty key, a key above 256 bytes or starting
// with "goog", or a value above 1024 bytes.
func CheckAttributes(attrs map[string]string) error {
	if len(attrs) > MaxAttributes {
		return fmt.Errorf("%d attributes (Outbox-* headers and the producer's), above Pub/Sub's limit of %d", len(attrs), MaxAttributes)
	}
	for k, v := range attrs {
		switch {
		case k == "":
			return errors.New("an attribute with an empty key")
		case len(k) > MaxAttributeKeyBytes:
			return fmt.Errorf("attribute key %.40q… of %d bytes, above Pub/Sub's limit of %d", k, len(k), MaxAttributeKeyBytes)
		case strings.HasPrefix(strings.ToLower(k), "goog"):
			return fmt.Errorf("attribute key %q: Pub/Sub reserves keys starting with \"goog\"", k)
		case len(v) > MaxAttributeValueBytes:
			return fmt.Errorf("attribute %q: value of %d bytes, above Pub/Sub's limit of %d", k, len(v), MaxAttributeValueBytes)
		}
	}
	return nil
}
