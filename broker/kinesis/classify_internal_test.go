package kinesis

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/pgoutbox/pgoutbox/broker"
)

// TestClassify covers the error codes the emulator cannot be made to answer
// (throttling, KMS, expired tokens) as the SDK reports them.
func TestClassify(t *testing.T) {
	t.Parallel()
	answer := func(status int, code string) error {
		var err error = &smithy.GenericAPIError{Code: code, Message: "m"}
		if code == "" {
			err = errors.New("an answer without a code")
		}
		return &smithyhttp.ResponseError{Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}}, Err: err}
	}
	for _, tc := range []struct {
		err                             error
		unavailable, misconf, permanent bool
	}{
		{answer(400, "ProvisionedThroughputExceededException"), true, false, false},
		{answer(400, "KMSThrottlingException"), true, false, false},
		{answer(500, "InternalFailureException"), true, false, false},
		{answer(503, ""), true, false, false},
		{answer(0, ""), true, false, false}, // no answer
		{answer(400, "ResourceNotFoundException"), true, true, false},
		{answer(400, "AccessDeniedException"), true, true, false},
		{answer(400, "ExpiredTokenException"), true, true, false},
		{answer(403, ""), true, true, false},
		{answer(400, "InvalidArgumentException"), false, false, true},
		{answer(400, "SomethingNew"), false, false, false},
		{errors.New("dial tcp: connection refused"), true, false, false},
		{context.Canceled, false, false, false},
	} {
		err := classify(tc.err)
		if broker.IsUnavailable(err) != tc.unavailable || broker.IsMisconfigured(err) != tc.misconf || broker.IsPermanent(err) != tc.permanent {
			t.Errorf("%v: unavailable %v, misconfigured %v, permanent %v; want %v, %v, %v", tc.err,
				broker.IsUnavailable(err), broker.IsMisconfigured(err), broker.IsPermanent(err), tc.unavailable, tc.misconf, tc.permanent)
		}
	}
}
