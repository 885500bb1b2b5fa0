package rabbittest

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// Queue declares, on a connection of its own to url, a topic exchange and a
// durable queue both called name (pgtest.Name makes one a test owns), the
// queue declared with args and bound to every routing key ("#"). The test's
// cleanup deletes both and closes the connection. Read the queue with Drain
// on the returned channel.
func Queue(tb testing.TB, url, name string, args amqp.Table) *amqp.Channel {
	tb.Helper()
	conn, err := amqp.Dial(url)
	pgtest.Must(tb, err, "connect to RabbitMQ")
	tb.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	pgtest.Must(tb, err, "open a channel")
	pgtest.Must(tb, ch.ExchangeDeclare(name, "topic", true, false, false, false, nil), "declare the exchange")
	_, err = ch.QueueDeclare(name, true, false, false, false, args)
	pgtest.Must(tb, err, "declare the queue")
	pgtest.Must(tb, ch.QueueBind(name, "#", name, false, nil), "bind the queue")
	tb.Cleanup(func() {
		_, _ = ch.QueueDelete(name, false, false, false)
		_ = ch.ExchangeDelete(name, false, false)
	})
	return ch
}

// Drain takes every message the queue name holds now, acknowledged as taken
// (basic.get with auto-ack), in queue order.
func Drain(tb testing.TB, ch *amqp.Channel, name string) []amqp.Delivery {
	tb.Helper()
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(name, true)
		pgtest.Must(tb, err, "get from the queue")
		if !ok {
			return out
		}
		out = append(out, d)
	}
}
