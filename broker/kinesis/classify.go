package kinesis

import (
	"context"
	"errors"

	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/pgoutbox/pgoutbox/broker"
)

// classify marks err, the failure of a request to Kinesis (see the package
// doc). A cancelled context stays unmarked.
func classify(err error) error {
	if errors.Is(err, context.Canceled) {
		return err
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode() {
		case "ProvisionedThroughputExceededException", "ThrottlingException", "KMSThrottlingException",
			"LimitExceededException", "ResourceInUseException", "InternalFailureException",
			"ServiceUnavailable", "ServiceUnavailableException", "RequestTimeout", "RequestTimeoutException":
			return broker.Unavailable(err)
		case "AccessDeniedException", "KMSAccessDeniedException", "UnrecognizedClientException",
			"InvalidSignatureException", "SignatureDoesNotMatch", "IncompleteSignatureException",
			"ExpiredTokenException", "InvalidClientTokenId", "MissingAuthenticationToken",
			"MissingAuthenticationTokenException", "KMSDisabledException", "KMSInvalidStateException",
			"KMSNotFoundException", "KMSOptInRequired", "ResourceNotFoundException":
			return broker.Misconfigured(err)
		case "InvalidArgumentException", "ValidationException":
			return broker.Permanent(err)
		}
	}
	var resp *smithyhttp.ResponseError
	if errors.As(err, &resp) {
		switch code := resp.HTTPStatusCode(); {
		case code == 0 || code >= 500 || code == 429 || code == 408: // 0: the SDK got no answer
			return broker.Unavailable(err)
		case code == 401 || code == 403:
			return broker.Misconfigured(err)
		}
		return err // another answer: retried, counted towards quarantine
	}
	// No answer at all: the network, the endpoint, a timeout.
	return broker.Unavailable(err)
}
