package nats_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/nats"
	"github.com/pgoutbox/pgoutbox/broker/nats/natsembed"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, brokertest.Harness{
		Open: openEmbedded,
		// A space cannot be in a subject.
		Invalid: func(m *broker.Message) { m.EventType = "was created" },
		Dedup:   true,
	})
}

// openEmbedded runs a server of the subtest's own, which the suite may stop and
// start again on the same port and store.
func openEmbedded(t *testing.T, opts brokertest.Options) *brokertest.Instance {
	dir := t.TempDir()
	first, err := natsembed.New(&natsembed.Config{StoreDir: dir, Port: -1})
	if err != nil {
		t.Fatalf("natsembed.New: %v", err)
	}
	u, err := url.Parse(first.URL())
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())

	var mu sync.Mutex
	srv := first // nil while stopped
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		if srv != nil {
			srv.Shutdown()
		}
	})

	cfg := nats.Config{Logger: quiet}
	if opts.WrapConn != nil {
		cfg.DialOptions = append(cfg.DialOptions, natsgo.SetCustomDialer(wrapDialer{opts.WrapConn}))
	}
	pub, err := nats.Dial(t.Context(), first.URL(), &cfg)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = pub.Close() })

	return &brokertest.Instance{
		Publisher: pub,
		Read: func(ctx context.Context) ([]brokertest.Stored, error) {
			return readStream(ctx, first.URL(), "OUTBOX")
		},
		Stop: func(context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			if srv != nil {
				srv.Shutdown()
				srv = nil
			}
			return nil
		},
		Start: func(context.Context) error {
			s, err := natsembed.New(&natsembed.Config{StoreDir: dir, Port: port})
			if err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			srv = s
			return nil
		},
	}
}

type wrapDialer struct{ wrap func(net.Conn) net.Conn }

func (d wrapDialer) Dial(network, address string) (net.Conn, error) {
	c, err := net.DialTimeout(network, address, 2*time.Second)
	if err != nil {
		return nil, err
	}
	return d.wrap(c), nil
}

// readStream returns every message of the stream, in stream order.
func readStream(ctx context.Context, url, stream string) ([]brokertest.Stored, error) {
	nc, err := natsgo.Connect(url)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	state := s.CachedInfo().State
	if state.Msgs == 0 {
		return nil, nil
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	out := make([]brokertest.Stored, 0, state.Msgs)
	// Fetch exactly what remains and drain every batch, so no fetch is left
	// waiting for messages that will never come.
	for uint64(len(out)) < state.Msgs {
		batch, err := c.Fetch(int(min(1000, state.Msgs-uint64(len(out)))), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, err
		}
		n := 0
		for m := range batch.Messages() {
			n++
			h := map[string]string{}
			for k, v := range m.Headers() {
				h[k] = v[0]
			}
			out = append(out, brokertest.Stored{Destination: m.Subject(), Headers: h, Body: m.Data()})
		}
		if err := batch.Error(); err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, fmt.Errorf("read %d of %d messages: nothing more within the fetch wait", len(out), state.Msgs)
		}
	}
	return out, nil
}
