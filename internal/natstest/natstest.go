// Package natstest gives tests a JetStream stream of their own on the local NATS
// server (PGOUTBOX_TEST_NATS_URL, else nats://127.0.0.1:4222), deleted when the test
// ends, and reads back what a stream holds.
package natstest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/wire"
)

// URL returns the shared test server's URL.
func URL() string {
	if v := os.Getenv("PGOUTBOX_TEST_NATS_URL"); v != "" {
		return v
	}
	return "nats://127.0.0.1:4222"
}

// Target is a stream name and subject space unique to one test.
type Target struct {
	Stream   string // e.g. T1A2B3C4D5E6
	Prefix   string // the subjects' first token, e.g. t1a2b3c4d5e6
	Template string // Prefix + ".{aggregate_type}.{event_type}"
	JS       jetstream.JetStream
}

// Subjects returns the stream subjects covering the target's template.
func (t Target) Subjects() []string { return []string{t.Prefix + ".>"} }

// New returns a fresh target on the shared server at url; its stream, once someone
// creates it, is deleted when the test ends.
func New(tb testing.TB, url string) Target { return newTarget(tb, url, true) }

// OnOwnServer returns a fresh target on a server the test started itself (and will
// shut down, taking the stream with it).
func OnOwnServer(tb testing.TB, url string) Target { return newTarget(tb, url, false) }

func newTarget(tb testing.TB, url string, deleteStream bool) Target {
	tb.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	nc, err := natsgo.Connect(url, natsgo.Name("pgoutbox test"))
	if err != nil {
		tb.Fatalf("natstest: connect to %s: %v (is nats-server running? .ci/run starts it)", url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatalf("natstest: jetstream: %v", err)
	}
	t := Target{Stream: "T" + strings.ToUpper(id), Prefix: "t" + id, JS: js}
	t.Template = t.Prefix + ".{aggregate_type}.{event_type}"
	tb.Cleanup(func() {
		defer nc.Close()
		if !deleteStream {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, t.Stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			tb.Errorf("natstest: delete stream %s: %v", t.Stream, err)
		}
	})
	return t
}

// Read returns every message in the stream, in stream order, decoded from the wire
// headers (either format). A stream that does not exist reads as empty.
func (t Target) Read(tb testing.TB) []broker.Message {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := t.JS.Stream(ctx, t.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		tb.Fatalf("natstest: stream %s: %v", t.Stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		tb.Fatalf("natstest: stream info: %v", err)
	}
	total := int(info.State.Msgs)
	if total == 0 {
		return nil
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		tb.Fatalf("natstest: ordered consumer: %v", err)
	}
	out := make([]broker.Message, 0, total)
	for len(out) < total {
		batch, err := c.Fetch(min(total-len(out), 1000), jetstream.FetchMaxWait(5*time.Second))
		if errors.Is(err, natsgo.ErrNoResponders) && ctx.Err() == nil {
			// A clustered stream's new consumer is not placed yet: ask again
			// (paced as internal/wait polls, until ctx ends).
			time.Sleep(wait.Interval)
			continue
		}
		if err != nil {
			tb.Fatalf("natstest: fetch: %v", err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			h := msg.Headers()
			names := slices.Collect(maps.Keys(h))
			m, err := wire.ParseReceived(msg.Data(), names, h.Get)
			if err != nil {
				tb.Fatalf("natstest: message %d of %s: %v", len(out)+1, msg.Subject(), err)
			}
			out = append(out, m)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, natsgo.ErrTimeout) {
			if errors.Is(err, natsgo.ErrNoResponders) && ctx.Err() == nil {
				// The pull's answer may say so too, not only Fetch: the
				// consumer moved with the stream's leader. Ask again.
				time.Sleep(wait.Interval)
				continue
			}
			tb.Fatalf("natstest: fetch: %v", err)
		}
		if n == 0 {
			tb.Fatalf("natstest: stream %s: read %d of %d messages, then nothing", t.Stream, len(out), total)
		}
	}
	return out
}
