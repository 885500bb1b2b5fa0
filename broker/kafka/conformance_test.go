package kafka_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/kafka"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, brokertest.Harness{
		Open: openCluster,
		// Larger than a produce batch may be (kgo.ProducerBatchMaxBytes): the
		// client refuses it with MESSAGE_TOO_LARGE, alone.
		Invalid: func(m *broker.Message) { m.Payload = []byte(`"` + strings.Repeat("x", 2<<20) + `"`) },
		// The idempotent producer drops only its own retries; a relay's
		// re-publish is a new record.
		Dedup: false,
	})
}

// openCluster runs a cluster of the subtest's own. It keeps its data on disk
// (kfake.DataDir), so Stop closes it and Start runs a new one on the same ports
// that loads what the old one stored: a broker restart.
func openCluster(t *testing.T, opts brokertest.Options) *brokertest.Instance {
	c := newCluster(t, true)
	cfg := kafka.Config{
		Logger: quiet,
		// Short, so that records cut off by the stop fail soon after it.
		ProduceTimeout: 3 * time.Second,
	}
	if opts.WrapConn != nil {
		cfg.DialOptions = append(cfg.DialOptions, kgo.Dialer(func(ctx context.Context, network, host string) (net.Conn, error) {
			conn, err := (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, network, host)
			if err != nil {
				return nil, err
			}
			return opts.WrapConn(conn), nil
		}))
	}
	pub := c.dial(cfg)
	return &brokertest.Instance{
		Publisher: pub,
		Read: func(ctx context.Context) ([]brokertest.Stored, error) {
			return readStored(ctx, c.addrs())
		},
		Stop: func(context.Context) error {
			c.stop()
			return nil
		},
		Start: func(context.Context) error { return c.start() },
	}
}
