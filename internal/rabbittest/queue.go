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
	ch := Exchange(tb, url, name)
	BindQueue(tb, ch, name, args)
	return ch
}

// Exchange is Queue without the queue: a topic exchange called name, which
// routes nowhere until BindQueue. The test's cleanup deletes it, the queue
// called name if there is one, and the connection.
func Exchange(tb testing.TB, url, name string) *amqp.Channel {
	tb.Helper()
	conn, err := amqp.Dial(url)
	pgtest.Must(tb, err, "connect to RabbitMQ")
	tb.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	pgtest.Must(tb, err, "open a channel")
	pgtest.Must(tb, ch.ExchangeDeclare(name, "topic", true, false, false, false, nil), "declare the exchange")
	tb.Cleanup(func() {
		_, _ = ch.QueueDelete(name, false, false, false)
		_ = ch.ExchangeDelete(name, false, false)
	})
	return ch
}

// BindQueue declares the durable queue called name with args and binds it to
// every routing key ("#") of the exchange called name.
func BindQueue(tb testing.TB, ch *amqp.Channel, name string, args amqp.Table) {
	tb.Helper()
	_, err := ch.QueueDeclare(name, true, false, false, false, args)
	pgtest.Must(tb, err, "declare the queue")
	pgtest.Must(tb, ch.QueueBind(name, "#", name, false, nil), "bind the queue")
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
