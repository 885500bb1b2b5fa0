package rabbitmq_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, brokertest.Harness{
		Open: openInstance,
		// AMQP cannot carry a routing key (or a type property) above 255 bytes.
		Invalid: func(m *broker.Message) { m.EventType = strings.Repeat("x", 300) },
		// RabbitMQ has no duplicate window.
		Dedup: false,
		// The handshake reads about 600 bytes and an ack frame is 21, one ack
		// often covering several messages: after 4 KiB the first few hundred
		// of the 5000 messages are confirmed. With the default 16 KiB, the
		// trip comes late in the batch and little is sent into the partition.
		StopAfterRead: 4 << 10,
	})
}

// openInstance gives the subtest an exchange and a queue of its own on the
// shared server. The suite cannot stop a server others use, so when it asks for
// Stop and Start the publisher goes through a proxy of the subtest's, which Stop
// cuts off and Start restores: to the publisher, the server went down and came
// back with its data, which is what the suite checks.
func openInstance(t *testing.T, opts brokertest.Options) *brokertest.Instance {
	cfg, adm, queue := isolated(t)
	url := sharedURL
	var prx *proxy
	if opts.WrapConn != nil {
		prx = newProxy(t, sharedAddr(t))
		if err := prx.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		url = withHost(t, prx.addr)
		cfg.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return opts.WrapConn(c), nil
		}
	}
	pub := dial(t, url, cfg)

	// Read takes messages off the queue; it keeps them, so that every call
	// returns all that were ever stored.
	var (
		mu     sync.Mutex
		stored []amqp.Delivery
	)
	inst := &brokertest.Instance{
		Publisher: pub,
		Read: func(context.Context) ([]brokertest.Stored, error) {
			mu.Lock()
			defer mu.Unlock()
			// Confirmed messages are in the queue already: no wait needed.
			more, err := getAll(adm.ch, queue)
			if err != nil {
				return nil, err
			}
			stored = append(stored, more...)
			return storedOf(stored), nil
		},
	}
	if prx != nil {
		inst.Stop, inst.Start = prx.Stop, prx.Start
	}
	return inst
}
