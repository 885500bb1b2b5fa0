package pubsub

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"cloud.google.com/go/pubsub/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pgoutbox/pgoutbox/broker"
)

// TestClassify covers the answers pstest cannot be made to give as the
// client reports them.
func TestClassify(t *testing.T) {
	t.Parallel()
	answer := func(c codes.Code) error { return fmt.Errorf("publish: %w", status.Error(c, "m")) }
	for _, tc := range []struct {
		err                             error
		unavailable, misconf, permanent bool
	}{
		{answer(codes.Unavailable), true, false, false},
		{answer(codes.DeadlineExceeded), true, false, false},
		{answer(codes.ResourceExhausted), true, false, false},
		{answer(codes.Internal), true, false, false},
		{answer(codes.PermissionDenied), true, true, false},
		{answer(codes.Unauthenticated), true, true, false},
		{answer(codes.NotFound), true, true, false},
		{answer(codes.InvalidArgument), false, false, true},
		{answer(codes.FailedPrecondition), false, false, false},
		{pubsub.ErrOversizedMessage, false, false, true},
		{errors.New("dial tcp: connection refused"), true, false, false},
		{context.DeadlineExceeded, true, false, false},
		{context.Canceled, false, false, false},
	} {
		err := classify(tc.err)
		if broker.IsUnavailable(err) != tc.unavailable || broker.IsMisconfigured(err) != tc.misconf || broker.IsPermanent(err) != tc.permanent {
			t.Errorf("%v: unavailable %v, misconfigured %v, permanent %v; want %v, %v, %v", tc.err,
				broker.IsUnavailable(err), broker.IsMisconfigured(err), broker.IsPermanent(err), tc.unavailable, tc.misconf, tc.permanent)
		}
	}
	if err := classify(pubsub.ErrPublishingPaused{OrderingKey: "k"}); !errors.Is(err, broker.ErrPredecessorFailed) {
		t.Errorf("paused key: %v, want ErrPredecessorFailed", err)
	}
}
