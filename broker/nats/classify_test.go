package nats

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox/broker"
)

// The JetStream API's answers are classified by what they say about the
// message: a refusal of the message is permanent, the server's state
// (including the 4xx answers meaning "not now", seen on a clustered stream
// whose leader changed) is unavailable, so that an outage never quarantines.
func TestClassifyAPIErrors(t *testing.T) {
	cases := []struct {
		err                  *jetstream.APIError
		permanent, transient bool
	}{
		{&jetstream.APIError{Code: 409, ErrorCode: errCodeDuplicateInProcess, Description: "duplicate message id is in process"}, false, true},
		{&jetstream.APIError{Code: 429, ErrorCode: errCodeTooManyRequests, Description: "too many requests"}, false, true},
		{&jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, false, true},
		{&jetstream.APIError{Code: 400, ErrorCode: 10060, Description: "expected stream does not match"}, true, false},
		{&jetstream.APIError{Code: 400, ErrorCode: 10054, Description: "message size exceeds maximum allowed"}, true, false},
	}
	for _, c := range cases {
		err := classify(fmt.Errorf("publish: %w", c.err))
		if broker.IsPermanent(err) != c.permanent || broker.IsUnavailable(err) != c.transient {
			t.Errorf("%d/%d %q: permanent %v, unavailable %v; want %v, %v", c.err.Code, c.err.ErrorCode, c.err.Description,
				broker.IsPermanent(err), broker.IsUnavailable(err), c.permanent, c.transient)
		}
	}
}
