package sqs

import (
	"errors"
	"testing"

	"github.com/aws/smithy-go"

	"github.com/pgoutbox/pgoutbox/broker"
)

func TestClassify(t *testing.T) {
	api := func(code string, fault smithy.ErrorFault) error {
		return &smithy.GenericAPIError{Code: code, Message: "m", Fault: fault}
	}
	for _, c := range []struct {
		err                    error
		misconf, unavail, perm bool
	}{
		{api("InvalidClientTokenId", smithy.FaultClient), true, true, false},
		{api("SignatureDoesNotMatch", smithy.FaultClient), true, true, false},
		{api("AccessDenied", smithy.FaultClient), true, true, false},
		{api("AWS.SimpleQueueService.NonExistentQueue", smithy.FaultClient), true, true, false},
		{api("ThrottlingException", smithy.FaultClient), false, true, false},
		{api("Whatever", smithy.FaultServer), false, true, false},
		{api("InvalidParameterValue", smithy.FaultClient), false, false, true},
		{errors.New("dial tcp: connection refused"), false, true, false},
	} {
		err := classify("x", c.err)
		if broker.IsMisconfigured(err) != c.misconf || broker.IsUnavailable(err) != c.unavail || broker.IsPermanent(err) != c.perm {
			t.Errorf("%v: misconfigured %v unavailable %v permanent %v", err, broker.IsMisconfigured(err), broker.IsUnavailable(err), broker.IsPermanent(err))
		}
	}
	if err := classifyEntry(batchFailure{code: "InvalidMessageContents", senderFault: true}); !broker.IsPermanent(err) {
		t.Errorf("sender's fault: %v, want permanent", err)
	}
	if err := classifyEntry(batchFailure{code: "InternalError"}); !broker.IsUnavailable(err) {
		t.Errorf("service's fault: %v, want unavailable", err)
	}
}

func TestGroupIDKeepsLanesApart(t *testing.T) {
	pairs := [][2]string{{"a:b", "c"}, {"a", "b:c"}, {"~x", "y"}, {"a", "b"}, {"ab", ""}}
	seen := map[string][2]string{}
	for _, p := range pairs {
		g := groupID(p[0], p[1])
		if len(g) > maxIDLen || !idChars(g) {
			t.Errorf("groupID%q = %q: not a valid group id", p, g)
		}
		if q, dup := seen[g]; dup {
			t.Errorf("lanes %q and %q share group %q", p, q, g)
		}
		seen[g] = p
	}
}
