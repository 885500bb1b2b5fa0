package subscriber

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/logtest"
)

type sampleConfig struct {
	Concurrency int
	Prefetch    int
	Logger      *slog.Logger
}

func (c *sampleConfig) resolve() (sampleConfig, error) {
	return Resolve("sample", c, func(c *sampleConfig) Shared {
		return Shared{Concurrency: &c.Concurrency, Logger: &c.Logger}
	}, func(out *sampleConfig) {
		config.Default(&out.Prefetch, 2*out.Concurrency)
	}, func(out *sampleConfig, p *config.Problems) {
		p.Check(out.Prefetch > 0, "Config.Prefetch %d: must be positive", out.Prefetch)
	})
}

// Resolve fills the shared fields before the subscriber's own defaults, which
// may build on them, and checks them beside the subscriber's own checks.
func TestResolveShared(t *testing.T) {
	got, err := (*sampleConfig)(nil).resolve()
	if err != nil || got.Concurrency != DefaultConcurrency || got.Prefetch != 2*DefaultConcurrency || got.Logger != slog.Default() {
		t.Fatalf("nil config: %+v, %v", got, err)
	}
	for _, tc := range []struct {
		in   sampleConfig
		want []string
	}{
		{sampleConfig{Concurrency: 1025, Prefetch: 1}, []string{"sample: Config.Concurrency 1025: want 1..1024"}},
		{sampleConfig{Concurrency: -1, Prefetch: -1}, []string{"sample: Config.Concurrency -1: want 1..1024", "sample: Config.Prefetch -1: must be positive"}},
	} {
		_, err := tc.in.resolve()
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: error %v lacks %q", tc.in, err, w)
			}
		}
	}
	own := slog.New(slog.DiscardHandler)
	if got, err := (&sampleConfig{Concurrency: 1024, Logger: own}).resolve(); err != nil || got.Logger != own || got.Prefetch != 2048 {
		t.Errorf("set fields: %+v, %v", got, err)
	}
}

// The service's start block runs the set-up, logs, starts the readers and the
// workers; its stop tail runs Halt, releases what was pulled but not started,
// runs Close, and logs the counters.
func TestServiceStartAndStopTail(t *testing.T) {
	f := &fake{}
	var log logtest.Buffer
	release := make(chan struct{})
	started := make(chan struct{})
	var svc Service[*msg]
	svc.Init(Setup[*msg]{
		Name: "sample", Broker: f, ProcessTimeout: time.Minute, Concurrency: 2, Log: log.Logger(),
		Processor: procFunc(func(ctx context.Context, d inbox.Delivery) inbox.Outcome {
			if d.Headers["id"] == "1" {
				close(started)
				<-release
			}
			return inbox.Outcome{Status: inbox.StatusApplied}
		}),
		Counters: func() []any { return []any{slog.Int("settled", len(f.all()))} },
		Halt:     func() { f.note("halt") },
		Close:    func() { f.note("close") },
	})
	read := make(chan struct{})
	err := svc.Start(context.Background(), func(context.Context) ([]func(), []any, error) {
		// One lane: the second waits behind the first, which is held.
		svc.Push(&msg{id: 1, lane: "a"})
		svc.Push(&msg{id: 2, lane: "a"})
		return []func(){func() { <-svc.Lifecycle.Stopping(); close(read) }}, []any{slog.String("stream", "s")}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	<-started
	stopped := make(chan error, 1)
	go func() { stopped <- svc.Lifecycle.Stop(context.Background()) }()
	<-svc.Lifecycle.Stopping()
	close(release)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	<-read
	if got, want := f.all(), []string{"ack 1", "halt", "release 2", "close"}; !slices.Equal(got, want) {
		t.Errorf("settled %q, want %q", got, want)
	}
	out := log.String()
	for _, w := range []string{`msg="subscriber starting" concurrency=2 stream=s`, `msg="subscriber stopped" settled=4`} {
		if !strings.Contains(out, w) {
			t.Errorf("log lacks %q:\n%s", w, out)
		}
	}
}

// Read pulls as long as there is room, logs a failed pull and pulls again
// after the backoff, and ends once the stop begins, without logging the pull
// the stop ended.
func TestServiceRead(t *testing.T) {
	f := &fake{}
	var log logtest.Buffer
	acked := make(chan struct{})
	var svc Service[*msg]
	svc.Init(Setup[*msg]{
		Name: "sample", Broker: f, ProcessTimeout: time.Minute, Concurrency: 1, Log: log.Logger(),
		Processor: procFunc(func(context.Context, inbox.Delivery) inbox.Outcome {
			close(acked)
			return inbox.Outcome{Status: inbox.StatusApplied}
		}),
		Counters: func() []any { return nil },
	})
	pulls := 0
	pull := func(n int) error {
		pulls++
		switch pulls {
		case 1:
			return errors.New("broker down")
		case 2:
			if n != 4 {
				t.Errorf("pull of %d, want the room below high (4)", n)
			}
			svc.Push(&msg{id: 1, lane: "a"})
			return nil
		}
		// Until the stop, which ends the pull in progress: not a failure to log.
		<-svc.Lifecycle.Stopping()
		return errors.New("stopping")
	}
	err := svc.Start(context.Background(), func(context.Context) ([]func(), []any, error) {
		return []func(){func() { svc.Read(0, 4, "pull", pull) }}, nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	<-acked
	if err := svc.Lifecycle.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if pulls < 2 {
		t.Errorf("%d pulls, want the failed one and the one after it", pulls)
	}
	if out := log.String(); strings.Count(out, `msg="pull failed; retrying"`) != 1 || !strings.Contains(out, `error="broker down"`) {
		t.Errorf("log: want the one failed pull, not the one the stop ended:\n%s", out)
	}
}
