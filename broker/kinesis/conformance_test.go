package kinesis_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/kinesis"
	"github.com/pgoutbox/pgoutbox/broker/kinesis/kinesistest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, brokertest.Harness{
		Open: open,
		// A payload above Kinesis's 1 MiB record limit.
		Invalid: func(m *broker.Message) {
			m.Payload = append(append([]byte(`"`), bytes.Repeat([]byte("x"), kinesis.MaxRecordBytes)...), '"')
		},
		Dedup: false, // Kinesis has none: the inbox drops duplicates
	})
}

// open gives each subtest a stream of 2 shards of its own: on the shared
// emulator, or for the stop/start subtest on an emulator of its own that
// keeps its data on disk.
func open(t *testing.T, opts brokertest.Options) *brokertest.Instance {
	var srv *kinesistest.Server
	if opts.WrapConn != nil {
		srv = kinesistest.Start(t, t.TempDir())
	} else {
		srv = kinesistest.Shared(t)
	}
	stream := srv.CreateStream(t, 2)
	inst := &brokertest.Instance{
		Publisher: dial(t, srv, stream, kinesis.DialConfig{}, opts.WrapConn),
		Read:      func(ctx context.Context) ([]brokertest.Stored, error) { return read(ctx, srv, stream) },
	}
	if opts.WrapConn != nil {
		inst.Stop = func(context.Context) error { return srv.Stop() }
		inst.Start = func(context.Context) error { return srv.Restart() }
	}
	return inst
}
