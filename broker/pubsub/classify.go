package pubsub

import (
	"context"
	"errors"

	"cloud.google.com/go/pubsub/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pgoutbox/pgoutbox/broker"
)

// classify marks err, the failure of a publish to Pub/Sub (see the package
// doc). A cancelled context stays unmarked.
func classify(err error) error {
	var paused pubsub.ErrPublishingPaused
	switch {
	case errors.Is(err, context.Canceled):
		return err
	case errors.As(err, &paused):
		// An earlier publish on the key failed and its failure was not seen
		// (its Publish call gave up first): not an attempt of this event.
		return errors.Join(err, broker.ErrPredecessorFailed)
	case errors.Is(err, pubsub.ErrOversizedMessage):
		return broker.Permanent(err)
	case errors.Is(err, pubsub.ErrPublisherStopped):
		return err
	}
	s, ok := status.FromError(err)
	if !ok {
		// No answer at all: the network, the endpoint, a timeout.
		return broker.Unavailable(err)
	}
	switch s.Code() {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Internal, codes.Aborted:
		return broker.Unavailable(err)
	case codes.PermissionDenied, codes.Unauthenticated, codes.NotFound:
		return broker.Misconfigured(err)
	case codes.InvalidArgument:
		return broker.Permanent(err)
	}
	return err // another answer: retried, counted towards quarantine
}
