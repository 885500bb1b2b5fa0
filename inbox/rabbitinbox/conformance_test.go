package rabbitinbox_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/inboxtest"
	"github.com/pgoutbox/pgoutbox/inbox/rabbitinbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// The subscriber conformance suite, on the shared RabbitMQ server.
func TestConformance(t *testing.T) {
	t.Parallel()
	inboxtest.Run(t, inboxtest.Harness{
		New: func(t *testing.T) inboxtest.Target { return &suiteTarget{target: newTarget(t, nil)} },
	})
}

// suiteTarget is a fresh queue for the suite; its subscribers' connections carry
// names of their own, so that CloseConnections closes only theirs.
type suiteTarget struct {
	*target
	names []string
}

func (s *suiteTarget) Publish(t *testing.T, msgs ...broker.Message) { s.publish(t, msgs...) }

func (s *suiteTarget) PublishRaw(t *testing.T, body []byte) {
	s.onChannel(t, func(ch *amqp.Channel) error {
		return ch.PublishWithContext(context.Background(), s.exchange, "order.updated", false, false,
			amqp.Publishing{ContentType: "application/json", Body: body})
	})
}

func (s *suiteTarget) NewSubscriber(t *testing.T, proc inbox.Processor, k inboxtest.Knobs) inboxtest.Subscriber {
	t.Helper()
	name := uniqueName("pgotest-inbox")
	s.names = append(s.names, name)
	cfg := rabbitinbox.Config{
		Queue: s.queue, ConnectionName: name, Concurrency: k.Concurrency, Logger: quiet,
		ReconnectBackoff: 20 * time.Millisecond, MaxReconnectBackoff: 500 * time.Millisecond,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sub, err := rabbitinbox.Dial(ctx, amqpURL, proc, &cfg)
	pgtest.Must(t, err, "rabbitinbox.Dial")
	return sub
}

func (s *suiteTarget) CloseConnections(t *testing.T) {
	for _, name := range s.names {
		pgtest.Must(t, closeConnection(name), "close connection %s", name)
	}
}
