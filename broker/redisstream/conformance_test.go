package redisstream_test

import (
	"context"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
)

// conformanceMax is the harness' Config.MaxMessageBytes: Invalid goes beyond it.
const conformanceMax = 64 << 10

func TestConformance(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, brokertest.Harness{
		Open:    openInstance,
		Invalid: func(m *broker.Message) { m.Payload = make([]byte, conformanceMax+1) },
		Dedup:   true,
	})
}

// openInstance uses the shared server, except for the restart subtest
// (Options.WrapConn set), which gets a server of its own to stop and start.
func openInstance(t *testing.T, opts brokertest.Options) *brokertest.Instance {
	url := sharedURL
	var srv *server
	if opts.WrapConn != nil {
		srv = startServer(t)
		url = srv.url()
	}
	c := client(t, mustAddr(t, url))
	cfg, prefix := isolated(t, c)
	cfg.MaxMessageBytes = conformanceMax
	if opts.WrapConn != nil {
		cfg.Dialer = wrapDialer(opts.WrapConn)
	}
	inst := &brokertest.Instance{
		Publisher: dial(t, url, cfg),
		Read: func(ctx context.Context) ([]brokertest.Stored, error) {
			return readStreams(ctx, c, prefix)
		},
	}
	if srv != nil {
		inst.Stop = func(context.Context) error { return srv.stop() }
		inst.Start = func(context.Context) error { return srv.start() }
	}
	return inst
}

func mustAddr(t testing.TB, url string) string {
	t.Helper()
	return url[len("redis://"):]
}
