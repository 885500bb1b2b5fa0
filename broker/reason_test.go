package broker_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker"
)

func TestClassifyFailure(t *testing.T) {
	base := errors.New("boom")
	for _, c := range []struct {
		err  error
		want broker.FailureReason
	}{
		{base, broker.ReasonError},
		{broker.Permanent(base), broker.ReasonPermanent},
		{fmt.Errorf("publish: %w", broker.Permanent(base)), broker.ReasonPermanent},
		{broker.Unavailable(base), broker.ReasonUnavailable},
		{broker.Misconfigured(base), broker.ReasonUnavailable},
	} {
		if got := broker.ClassifyFailure(c.err); got != c.want {
			t.Errorf("ClassifyFailure(%v) = %s, want %s", c.err, got, c.want)
		}
	}
}
