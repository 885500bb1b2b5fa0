package natsinbox_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/inboxtest"
	"github.com/pgoutbox/pgoutbox/inbox/natsinbox"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// ownServer is a JetStream server of the test's own, with file storage, that it
// can restart on the same port: the stream and the durable consumer survive.
type ownServer struct {
	opts server.Options
	srv  *server.Server
}

func startOwnServer(t *testing.T) *ownServer {
	t.Helper()
	o := &ownServer{opts: server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true}}
	o.start(t)
	o.opts.Port = o.srv.Addr().(*net.TCPAddr).Port
	t.Cleanup(func() { o.srv.Shutdown(); o.srv.WaitForShutdown() })
	return o
}

func (o *ownServer) start(t *testing.T) {
	t.Helper()
	opts := o.opts
	srv, err := server.NewServer(&opts)
	pgtest.Must(t, err, "NATS server")
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready within 10s")
	}
	o.srv = srv
}

func (o *ownServer) url() string { return "nats://" + o.srv.Addr().String() }

// restartTarget is the suite's target for BrokerRestart: a stream on a server of
// its own; CloseConnections restarts the server.
type restartTarget struct {
	suiteTarget
	own *ownServer
}

func newRestartTarget(t *testing.T) inboxtest.Target {
	own := startOwnServer(t)
	target := natstest.OnOwnServer(t, own.url())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := target.JS.CreateStream(ctx, jetstream.StreamConfig{
		Name: target.Stream, Subjects: target.Subjects(), Storage: jetstream.FileStorage})
	pgtest.Must(t, err, "create stream")
	return &restartTarget{suiteTarget: suiteTarget{target: target}, own: own}
}

func (r *restartTarget) NewSubscriber(t *testing.T, proc inbox.Processor, k inboxtest.Knobs) inboxtest.Subscriber {
	t.Helper()
	nc, err := natsgo.Connect(r.own.url(), natsgo.MaxReconnects(-1), natsgo.ReconnectWait(50*time.Millisecond))
	pgtest.Must(t, err, "connect to NATS")
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	pgtest.Must(t, err, "jetstream")
	sub, err := natsinbox.New(js, proc, &natsinbox.Config{Stream: r.target.Stream, Concurrency: k.Concurrency, Logger: quiet})
	pgtest.Must(t, err, "natsinbox.New")
	return sub
}

// CloseConnections restarts the server: every client connection is closed, and
// the clients reconnect to the new one.
func (r *restartTarget) CloseConnections(t *testing.T) {
	r.own.srv.Shutdown()
	r.own.srv.WaitForShutdown()
	r.own.start(t)
}
