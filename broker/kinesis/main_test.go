package kinesis_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/kinesis"
	"github.com/pgoutbox/pgoutbox/broker/kinesis/kinesistest"
)

// TestMain gives Dial the emulator's credentials through the AWS default
// chain (the environment), as the CLI gets them, and stops the shared
// emulator at the end.
func TestMain(m *testing.M) {
	for _, kv := range kinesistest.Env() {
		k, v, _ := cutEnv(kv)
		_ = os.Setenv(k, v)
	}
	code := m.Run()
	kinesistest.StopShared()
	os.Exit(code)
}

func cutEnv(kv string) (string, string, bool) {
	for i := range len(kv) {
		if kv[i] == '=' {
			return kv[:i], kv[i+1:], true
		}
	}
	return kv, "", false
}

// dial returns a publisher of the stream on srv through Dial (the default
// credential chain), its connections wrapped by wrap when not nil.
func dial(t *testing.T, srv *kinesistest.Server, stream string, cfg kinesis.DialConfig, wrap func(net.Conn) net.Conn) *kinesis.Publisher {
	t.Helper()
	if wrap != nil {
		cfg.HTTPClient = awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) {
			d := &net.Dialer{Timeout: 5 * time.Second}
			tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := d.DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return wrap(c), nil
			}
		})
	}
	pub, err := kinesis.Dial(t.Context(), "kinesis://"+stream+"?endpoint="+srv.Endpoint, &cfg)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

// read returns the stream's records decoded, in broker order.
func read(ctx context.Context, srv *kinesistest.Server, stream string) ([]brokertest.Stored, error) {
	recs, err := kinesistest.ReadAll(ctx, srv.Client(), stream)
	if err != nil {
		return nil, err
	}
	out := make([]brokertest.Stored, 0, len(recs))
	for _, r := range recs {
		h, body, err := kinesis.ParseRecord(r.Data)
		if err != nil {
			return nil, err
		}
		out = append(out, brokertest.Stored{Destination: stream, Key: r.PartitionKey, Headers: h, Body: body})
	}
	return out, nil
}

// publishOne publishes m and fails the test unless it is acknowledged.
func publishOne(t *testing.T, p broker.Publisher, m broker.Message) {
	t.Helper()
	if err := brokertest.Publish(t, p, m)[0]; err != nil {
		t.Fatalf("Publish: %v", err)
	}
}
