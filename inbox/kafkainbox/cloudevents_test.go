package kafkainbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/kafka"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/kafkainbox"
	"github.com/pgoutbox/pgoutbox/internal/inboxtest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/wire"
)

// TestCloudEventsFormat: the relay's Kafka adapter publishes in the CloudEvents
// format (and once in the default format); the subscriber's consumer applies
// each event once, as with the default format.
func TestCloudEventsFormat(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4, 2)
	publish := func(t *testing.T, enc wire.Encoding) broker.Publisher {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		p, err := kafka.Dial(ctx, "kafka://"+strings.Join(e.addrs, ","), &kafka.Config{Logger: quiet, Encoding: enc})
		pgtest.Must(t, err, "kafka.Dial")
		return p
	}
	inboxtest.CloudEvents(t, e.Effects, publish, func(t *testing.T, proc inbox.Processor) {
		e.subscribe(t, proc, kafkainbox.Config{})
	})
}
