package sqs

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/pgoutbox/pgoutbox/broker"
)

// Error codes of SQS and SNS, by what they say about the publisher.
var (
	// misconfiguredCodes: credentials, permissions, a missing queue or topic.
	misconfiguredCodes = codes(
		"InvalidClientTokenId", "SignatureDoesNotMatch", "AccessDenied", "AccessDeniedException",
		"UnrecognizedClientException", "MissingAuthenticationToken", "IncompleteSignature",
		"ExpiredToken", "ExpiredTokenException", "InvalidSecurity", "AuthorizationError",
		"KmsAccessDenied", "KMSAccessDenied", "KMS.AccessDeniedException", "KmsDisabled", "KMSDisabled",
		"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist", "NonExistentQueue",
		"NotFound", "NotFoundException", "QueueDeletedRecently", "InvalidAddress", "InvalidSecurityToken",
	)
	// unavailableCodes: throttling and the service's own failures.
	unavailableCodes = codes(
		"Throttling", "ThrottlingException", "RequestThrottled", "ThrottledException", "Throttled",
		"KmsThrottled", "KMSThrottled", "KMSThrottlingException", "ServiceUnavailable", "InternalError",
		"InternalFailure", "InternalErrorException", "RequestTimeout", "RequestTimeoutException",
		"RequestThrottledException", "TooManyRequestsException", "SlowDown",
	)
	// permanentCodes: the message itself is refused.
	permanentCodes = codes(
		"InvalidParameterValue", "InvalidParameter", "InvalidParameterValueException", "ParameterValueInvalid",
		"InvalidMessageContents", "MessageTooLong", "InvalidAttributeName", "InvalidAttributeValue",
		"InvalidBatchEntryId", "BatchEntryIdsNotDistinct", "BatchRequestTooLong", "ValidationError",
		"AWS.SimpleQueueService.InvalidBatchEntryId", "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
		"AWS.SimpleQueueService.BatchRequestTooLong", "InvalidParameterException", "ValidationException",
		"MissingParameter",
	)
)

func codes(cs ...string) map[string]bool {
	m := make(map[string]bool, len(cs))
	for _, c := range cs {
		m[c] = true
	}
	return m
}

// classify marks an error of a whole call (what was being done) as
// Misconfigured, Unavailable or Permanent; an error the tables do not know
// stays unmarked (retried, quarantined after the relay's max attempts). The
// service's message is quoted and cut short: it comes from outside.
func classify(what string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return broker.Unavailable(fmt.Errorf("sqs: %s: %w", what, err))
	}
	var api smithy.APIError
	if !errors.As(err, &api) {
		// No answer from the service: a network error, a timeout.
		return broker.Unavailable(fmt.Errorf("sqs: %s: %w", what, err))
	}
	status := 0
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) && re.Response != nil {
		status = re.HTTPStatusCode()
	}
	e := fmt.Errorf("sqs: %s: %s (HTTP %d): %.200q", what, boundCode(api.ErrorCode()), status, api.ErrorMessage())
	code := api.ErrorCode()
	switch {
	case misconfiguredCodes[code] || status == 401 || status == 403:
		return broker.Misconfigured(e)
	case unavailableCodes[code] || status == 429 || status >= 500 || api.ErrorFault() == smithy.FaultServer:
		return broker.Unavailable(e)
	case permanentCodes[code]:
		return broker.Permanent(e)
	}
	return e
}

// classifyEntry marks the failure of one batch entry.
func classifyEntry(f batchFailure) error {
	e := fmt.Errorf("sqs: entry refused: %s: %.200q", boundCode(f.code), f.message)
	switch {
	case misconfiguredCodes[f.code]:
		return broker.Misconfigured(e)
	case unavailableCodes[f.code] || !f.senderFault:
		return broker.Unavailable(e)
	}
	// The sender's fault: this message, as it is, will be refused again.
	return broker.Permanent(e)
}

// boundCode shows an error code, which comes from outside, quoted when it is
// not a plain identifier and cut short.
func boundCode(c string) string {
	if len(c) <= 64 && idChars(c) {
		return c
	}
	return fmt.Sprintf("%.64q", c)
}
