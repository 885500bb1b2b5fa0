package kafka

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/pgoutbox/pgoutbox/broker"
)

// refusals are the broker's answers about the record or its destination: sending
// the same event again gets the same answer, so the relay quarantines it at once.
//
//   - MESSAGE_TOO_LARGE also comes from the client itself, for a record larger
//     than kgo.ProducerBatchMaxBytes (franz-go's default, 1,000,012 bytes, is
//     just below Kafka's default message.max.bytes). Such a record fails alone.
//     From the broker it is about a whole batch: keep kgo.ProducerBatchMaxBytes
//     at or below the topic's max.message.bytes, or batches of small records can
//     be refused, and with them the records buffered behind them.
//   - TOPIC_AUTHORIZATION_FAILED and INVALID_TOPIC_EXCEPTION concern the topic
//     the event's template chose, as a NATS subject outside the stream does.
//     After granting the ACL, an operator retries the quarantined events.
var refusals = []*kerr.Error{
	kerr.MessageTooLarge,
	kerr.RecordListTooLarge,
	kerr.InvalidRecord,
	kerr.InvalidTopicException,
	kerr.TopicAuthorizationFailed,
}

// unclassified are broker answers that may be about the record or may pass:
// they are retried with backoff and quarantine the event after the relay's
// max-attempts. CORRUPT_MESSAGE is a CRC mismatch (a flipped bit in transit) as
// well as a record the broker cannot accept; kerr calls it retriable, but
// franz-go does not retry it.
var unclassified = []*kerr.Error{
	kerr.CorruptMessage,
	kerr.InvalidTimestamp,
	kerr.PolicyViolation,
	kerr.UnknownServerError,
}

// classify marks err, a produce failure, as permanent when the broker refused the
// record and as unavailable when nothing is wrong with the event: the cluster is
// unreachable or silent, the relay's credentials or client settings are refused,
// or the topic does not exist.
//
// A missing topic (UNKNOWN_TOPIC_OR_PARTITION, once kgo.UnknownTopicRetries is
// exhausted) is unavailable, not permanent: topics are created by operators or by
// the broker, often after the first events of a new aggregate type are written,
// and quarantining those events would turn a deployment step into poison
// events. The relay reports unhealthy and keeps retrying until the topic exists.
//
// Errors that are not Kafka error codes come from the client: timeouts
// (kgo.ErrRecordTimeout), a full buffer, a closed client, and network, TLS or
// SASL failures. None of them is about the event, so they are unavailable too.
func classify(err error) error {
	if err == nil || broker.IsPermanent(err) || broker.IsUnavailable(err) {
		return err
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	var ke *kerr.Error
	if !errors.As(err, &ke) {
		return broker.Unavailable(err)
	}
	for _, r := range refusals {
		if ke == r {
			return broker.Permanent(err)
		}
	}
	for _, u := range unclassified {
		if ke == u {
			return err
		}
	}
	// Retriable codes (NOT_ENOUGH_REPLICAS, LEADER_NOT_AVAILABLE,
	// REQUEST_TIMED_OUT, UNKNOWN_TOPIC_OR_PARTITION, …) mean the cluster is not
	// ready; the rest left here are about the relay's session or settings
	// (SASL_AUTHENTICATION_FAILED, CLUSTER_AUTHORIZATION_FAILED for idempotent
	// writes, UNSUPPORTED_VERSION, OUT_OF_ORDER_SEQUENCE_NUMBER, …), which
	// every event would meet alike.
	return broker.Unavailable(err)
}

// IsAuthError reports whether err is the cluster refusing the publisher's
// credentials (SASL_AUTHENTICATION_FAILED, a mechanism it does not offer, an
// illegal SASL state): every publish would meet it alike, so a caller that
// checks the cluster at start-up (pgoutbox relay does) should stop with a
// configuration error instead of waiting.
//
// A broker that closes the connection during the SASL exchange instead of
// answering (franz-go then reports a bare io.EOF) is deliberately not an auth
// error: a broker restarting or a proxy cutting connections looks the same, and
// such a relay must wait, not stop. Kafka itself answers
// SASL_AUTHENTICATION_FAILED before closing (since 1.0, KIP-152); franz-go's
// kfake hangs up instead (see sasl_test.go).
func IsAuthError(err error) bool {
	return errors.Is(err, kerr.SaslAuthenticationFailed) || errors.Is(err, kerr.UnsupportedSaslMechanism) ||
		errors.Is(err, kerr.IllegalSaslState)
}

// validateTopic checks s against Kafka's rules for topic names, so that a bad
// template or aggregate type fails fast and alone instead of in the broker's
// metadata answer.
func validateTopic(s string) error {
	switch {
	case s == "":
		return errors.New("empty topic name")
	case s == "." || s == "..":
		return fmt.Errorf("topic name %q is not allowed", s)
	case len(s) > 249:
		return fmt.Errorf("topic name %.40q… is %d bytes long, more than Kafka's 249", s, len(s))
	}
	for _, r := range s {
		if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("topic name %q contains %q: Kafka allows only ASCII letters, digits, '.', '_' and '-'", s, r)
		}
	}
	return nil
}
