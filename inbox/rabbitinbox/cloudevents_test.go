package rabbitinbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/rabbitmq"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/rabbitinbox"
	"github.com/pgoutbox/pgoutbox/internal/inboxtest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/wire"
)

// TestCloudEventsFormat: the relay's RabbitMQ adapter publishes in the
// CloudEvents format (and once in the default format); the subscriber's
// consumer applies each event once, as with the default format.
func TestCloudEventsFormat(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	publish := func(t *testing.T, enc wire.Encoding) broker.Publisher {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		p, err := rabbitmq.Dial(ctx, amqpURL, &rabbitmq.Config{Exchange: e.exchange, Logger: quiet, Encoding: enc})
		pgtest.Must(t, err, "dial the publisher")
		return p
	}
	inboxtest.CloudEvents(t, e.Effects, publish, func(t *testing.T, proc inbox.Processor) {
		e.subscribe(t, proc, rabbitinbox.Config{})
	})
}
