package kafka

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/broker"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	const (
		permanent   = "permanent"
		unavailable = "unavailable"
		plain       = "plain"
	)
	dialErr := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, tc := range []struct {
		err  error
		want string
	}{
		// About the record or its topic: quarantine at once.
		{fmt.Errorf("%w (uncompressed_bytes=2097154)", kerr.MessageTooLarge), permanent},
		{kerr.RecordListTooLarge, permanent},
		{kerr.InvalidRecord, permanent},
		{kerr.InvalidTopicException, permanent},
		{kerr.TopicAuthorizationFailed, permanent},
		// Maybe about the record: retried, then quarantined.
		{kerr.CorruptMessage, plain},
		{kerr.InvalidTimestamp, plain},
		{kerr.UnknownServerError, plain},
		{context.Canceled, plain},
		// The cluster, the relay's session or settings, or a missing topic.
		{kerr.UnknownTopicOrPartition, unavailable},
		{kerr.UnknownTopicID, unavailable},
		{kerr.NotEnoughReplicas, unavailable},
		{kerr.NotEnoughReplicasAfterAppend, unavailable},
		{kerr.LeaderNotAvailable, unavailable},
		{kerr.NotLeaderForPartition, unavailable},
		{kerr.RequestTimedOut, unavailable},
		{kerr.SaslAuthenticationFailed, unavailable},
		{kerr.ClusterAuthorizationFailed, unavailable},
		{kerr.OutOfOrderSequenceNumber, unavailable},
		{kgo.ErrRecordTimeout, unavailable},
		{kgo.ErrRecordRetries, unavailable},
		{kgo.ErrMaxBuffered, unavailable},
		{kgo.ErrClientClosed, unavailable},
		{dialErr, unavailable},
		{io.EOF, unavailable},
		{x509.UnknownAuthorityError{}, unavailable},
		{context.DeadlineExceeded, unavailable},
		// Classified already: kept.
		{broker.Permanent(errors.New("x")), permanent},
		{broker.Unavailable(kerr.MessageTooLarge), unavailable},
	} {
		got := classify(tc.err)
		class := plain
		switch {
		case broker.IsPermanent(got):
			class = permanent
		case broker.IsUnavailable(got):
			class = unavailable
		}
		if class != tc.want {
			t.Errorf("classify(%v) is %s, want %s", tc.err, class, tc.want)
		}
		if !errors.Is(got, tc.err) && !strings.Contains(got.Error(), tc.err.Error()) {
			t.Errorf("classify(%v) = %v lost the error", tc.err, got)
		}
	}
	if classify(nil) != nil {
		t.Error("classify(nil) != nil")
	}
}

func TestValidateTopic(t *testing.T) {
	t.Parallel()
	for topic, ok := range map[string]bool{
		"outbox.order":             true,
		"Outbox_v2-orders.created": true,
		strings.Repeat("a", 249):   true,
		strings.Repeat("a", 250):   false,
		"":                         false,
		".":                        false,
		"..":                       false,
		"outbox.order line":        false,
		"outbox/order":             false,
		"outbox.café":              false,
		"outbox.order\n":           false,
	} {
		if err := validateTopic(topic); (err == nil) != ok {
			t.Errorf("validateTopic(%.20q…) = %v, want ok=%v", topic, err, ok)
		}
	}
}

// The cluster's answers to credentials it refuses, however franz-go wraps them,
// are auth errors; outages and other refusals are not.
func TestIsAuthError(t *testing.T) {
	t.Parallel()
	for _, err := range []error{kerr.SaslAuthenticationFailed, kerr.UnsupportedSaslMechanism, kerr.IllegalSaslState,
		fmt.Errorf("kafka: ping: %w", kerr.SaslAuthenticationFailed), broker.Unavailable(fmt.Errorf("x: %w", kerr.SaslAuthenticationFailed))} {
		if !IsAuthError(err) {
			t.Errorf("IsAuthError(%v) = false", err)
		}
	}
	for _, err := range []error{nil, io.EOF, context.DeadlineExceeded, kerr.TopicAuthorizationFailed, kerr.NotLeaderForPartition,
		errors.New("SASL_AUTHENTICATION_FAILED"), broker.Unavailable(errors.New("dial tcp: connection refused"))} {
		if IsAuthError(err) {
			t.Errorf("IsAuthError(%v) = true", err)
		}
	}
}
