package relay_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/relay"
)

func TestClassifyFailure(t *testing.T) {
	t.Parallel()
	plain := errors.New("boom")
	for _, tc := range []struct {
		err  error
		want relay.FailureReason
	}{
		{broker.Permanent(plain), relay.ReasonPermanent},
		{fmt.Errorf("publish: %w", broker.Permanent(plain)), relay.ReasonPermanent},
		{broker.Unavailable(plain), relay.ReasonUnavailable},
		{fmt.Errorf("ack: %w", context.DeadlineExceeded), relay.ReasonUnavailable},
		{plain, relay.ReasonError},
	} {
		if got := relay.ClassifyFailure(tc.err); got != tc.want {
			t.Errorf("ClassifyFailure(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
	for r, want := range map[relay.Result]string{relay.ResultPublished: "published", relay.ResultFailed: "failed",
		relay.ResultQuarantined: "quarantined", relay.ResultReleased: "released", 0: "unknown"} {
		if r.String() != want {
			t.Errorf("Result(%d).String() = %q", r, r.String())
		}
	}
}
