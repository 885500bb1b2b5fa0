package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox/broker/nats/natsembed"
	"github.com/pgoutbox/pgoutbox/internal/redact"
)

// DefaultNATSURL is where the "nats" broker choice looks for a server before
// starting one in-process.
const DefaultNATSURL = "nats://127.0.0.1:4222"

// brokerEnv is one broker the relays publish to. For NATS it owns a stream of its
// own (created with file storage, purged between runs, deleted at the end) that a
// subscriber can read.
type brokerEnv struct {
	name     string // as shown in tables: null, nats, embedded, or the URL without its credentials
	url      string // the relays' --broker (PGOUTBOX_BROKER)
	embedded *natsembed.Server
	storeDir string
	nc       *natsgo.Conn
	js       jetstream.JetStream
	stream   string
	prefix   string
}

func (b *brokerEnv) isNATS() bool { return b.js != nil }

// relayArgs are the relays' broker flags; a relay serving many outboxes
// (tenants) puts the tenant in the subject, as it must.
func (b *brokerEnv) relayArgs(tenants bool) []string {
	var args []string
	if b.isNATS() {
		tmpl := b.prefix + ".{aggregate_type}"
		if tenants {
			tmpl = b.prefix + ".{tenant}.{aggregate_type}"
		}
		args = append(args, "--nats-stream", b.stream, "--topic-template", tmpl)
	}
	return args
}

// relayEnv passes the broker URL, which may hold credentials, in the relay's
// environment rather than on its command line, with what Config.RelayEnv adds
// for the broker's kind (its settings and secrets, which relayEnv otherwise
// drops with every PGOUTBOX_ variable).
func (b *brokerEnv) relayEnv(cfg *Config, relayID string) []string {
	env := []string{"PGOUTBOX_BROKER=" + b.url}
	if cfg.RelayEnv != nil {
		env = append(env, cfg.RelayEnv(b.url, relayID)...)
	}
	return env
}

// broker returns the broker env for a --broker choice, opening it on first use.
func (r *Runner) broker(ctx context.Context, choice string) (*brokerEnv, error) {
	if r.brokers == nil {
		r.brokers = map[string]*brokerEnv{}
	}
	if b, ok := r.brokers[choice]; ok {
		return b, nil
	}
	b, err := r.openBroker(ctx, choice)
	if err != nil {
		return nil, err
	}
	r.brokers[choice] = b
	return b, nil
}

func (r *Runner) openBroker(ctx context.Context, choice string) (*brokerEnv, error) {
	switch {
	case choice == "null" || choice == "null://":
		return &brokerEnv{name: "null", url: "null://"}, nil
	case choice == "nats":
		nc, err := natsgo.Connect(DefaultNATSURL, natsgo.Timeout(time.Second), natsgo.Name("pgoutbox bench"))
		if err == nil {
			return r.natsEnv(ctx, "nats", DefaultNATSURL, nc, nil, "")
		}
		r.cfg.Logger.Info("no NATS server at "+DefaultNATSURL+"; starting one in-process", slog.Any("error", err))
		return r.embeddedEnv(ctx, "embedded")
	case choice == "embedded":
		return r.embeddedEnv(ctx, "embedded")
	case strings.HasPrefix(choice, "nats://") || strings.HasPrefix(choice, "tls://"):
		nc, err := natsgo.Connect(choice, natsgo.Timeout(5*time.Second), natsgo.Name("pgoutbox bench"))
		if err != nil {
			return nil, fmt.Errorf("connect to NATS %s: %w", redact.URL(choice), err)
		}
		return r.natsEnv(ctx, redact.URL(choice), choice, nc, nil, "")
	case strings.Contains(choice, "://"):
		// Any other broker the relay speaks: published to, but not observed.
		return &brokerEnv{name: redact.URL(choice), url: choice}, nil
	}
	return nil, fmt.Errorf("unknown broker %q (want null, nats, embedded or a URL)", redact.URL(choice))
}

// embeddedEnv runs NATS JetStream inside the bench process: the relays connect to
// it over loopback like to any server.
func (r *Runner) embeddedEnv(ctx context.Context, name string) (*brokerEnv, error) {
	dir, err := os.MkdirTemp("", "pgoutbox-bench-nats")
	if err != nil {
		return nil, err
	}
	e, err := natsembed.New(&natsembed.Config{StoreDir: dir, Port: -1})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	nc, err := natsgo.Connect(e.URL(), natsgo.Name("pgoutbox bench"))
	if err != nil {
		e.Shutdown()
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("connect to embedded NATS: %w", err)
	}
	return r.natsEnv(ctx, name, e.URL(), nc, e, dir)
}

func (r *Runner) natsEnv(ctx context.Context, name, url string, nc *natsgo.Conn, e *natsembed.Server, dir string) (*brokerEnv, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	id := randHex(5)
	b := &brokerEnv{name: name, url: url, embedded: e, storeDir: dir, nc: nc, js: js,
		stream: "BENCH" + strings.ToUpper(id), prefix: "bench" + id}
	// Created here, once, rather than by whichever relay starts first.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: b.stream, Subjects: []string{b.prefix + ".>"},
		Storage: jetstream.FileStorage}); err != nil {
		b.close()
		return nil, fmt.Errorf("create stream %s: %w", b.stream, err)
	}
	return b, nil
}

// reset empties the stream between runs.
func (b *brokerEnv) reset(ctx context.Context) error {
	if !b.isNATS() {
		return nil
	}
	s, err := b.js.Stream(ctx, b.stream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", b.stream, err)
	}
	if err := s.Purge(ctx); err != nil {
		return fmt.Errorf("purge stream %s: %w", b.stream, err)
	}
	return nil
}

// messages returns how many messages the stream holds (JetStream drops
// re-publishes of an event id within its duplicate window, so this counts distinct
// events).
func (b *brokerEnv) messages(ctx context.Context) (uint64, error) {
	s, err := b.js.Stream(ctx, b.stream)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", b.stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("stream %s info: %w", b.stream, err)
	}
	return info.State.Msgs, nil
}

func (b *brokerEnv) close() {
	if b.js != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := b.js.DeleteStream(ctx, b.stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			_ = err // best effort: a stream left behind holds only benchmark data
		}
		cancel()
	}
	if b.nc != nil {
		b.nc.Close()
	}
	if b.embedded != nil {
		b.embedded.Shutdown()
	}
	if b.storeDir != "" {
		_ = os.RemoveAll(b.storeDir)
	}
}

func (r *Runner) closeBrokers() {
	for _, b := range r.brokers {
		b.close()
	}
}

func (r *Runner) natsVersion() string {
	for _, b := range r.brokers {
		if b.nc != nil {
			v := b.nc.ConnectedServerVersion()
			if b.embedded != nil {
				v += " (in-process)"
			}
			return v
		}
	}
	return ""
}

// natsBroker picks the broker latency observes: the first NATS one asked for,
// else the "nats" default.
func (r *Runner) natsBroker(ctx context.Context) (*brokerEnv, error) {
	for _, c := range r.cfg.Brokers {
		if c == "nats" || c == "embedded" || strings.HasPrefix(c, "nats://") || strings.HasPrefix(c, "tls://") {
			return r.broker(ctx, c)
		}
	}
	return r.broker(ctx, "nats")
}
