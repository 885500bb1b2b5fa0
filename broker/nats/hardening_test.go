package nats_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/nats"
	"github.com/pgoutbox/pgoutbox/wire"
)

// authServer runs a JetStream server that accepts user u with password right,
// and the token tok on a second one.
func authServer(t *testing.T, opts server.Options) string {
	t.Helper()
	opts.Host, opts.Port, opts.JetStream, opts.StoreDir, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, true, t.TempDir(), true, true
	s, err := server.NewServer(&opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(s.Shutdown)
	return s.Addr().String()
}

// Credentials the server refuses fail Dial at once (a configuration error),
// never a publisher that waits forever; the password is not in the error.
func TestDialRefusedCredentials(t *testing.T) {
	t.Parallel()
	userAddr := authServer(t, server.Options{Username: "u", Password: "right-pw"})
	tokenAddr := authServer(t, server.Options{Authorization: "good-token"})
	for _, url := range []string{
		"nats://u:wrong-pw@" + userAddr,
		"nats://u@" + userAddr,
		"nats://nobody:wrong-pw@" + userAddr,
		"nats://" + userAddr,
		"nats://bad-token@" + tokenAddr,
		"nats://" + tokenAddr,
		"nats://u:wrong-pw@" + userAddr + ",nats://u:wrong-pw@" + userAddr,
	} {
		p, err := nats.Dial(context.Background(), url, &nats.Config{Logger: quiet})
		if err == nil {
			_ = p.Close()
			t.Errorf("Dial(%s) accepted refused credentials", url)
			continue
		}
		if !errors.Is(err, natsgo.ErrAuthorization) || strings.Contains(err.Error(), "wrong-pw") || strings.Contains(err.Error(), "bad-token") {
			t.Errorf("Dial(%s): %v; want an authorization error without the secret", url, err)
		}
	}
	// The right ones connect.
	p, err := nats.Dial(context.Background(), "nats://u:right-pw@"+userAddr, &nats.Config{Logger: quiet})
	if err != nil {
		t.Fatalf("right credentials: %v", err)
	}
	_ = p.Close()
}

// A stream whose subjects cannot hold any subject of the template fails New
// (and is not created), and Publish never quarantines over it.
func TestStreamSubjectsThatCannotHoldTheTemplate(t *testing.T) {
	t.Parallel()
	js := sharedJetStream(t)
	for _, c := range []struct {
		subjects []string
		template string
		ok       bool
	}{
		{[]string{"foo.>"}, "outbox.{aggregate_type}", false},
		{[]string{"outbox.*.created"}, "outbox.{aggregate_type}", false},
		{[]string{"outbox.order"}, "outbox.{aggregate_type}.{event_type}", false},
		{[]string{"a.>", "b.*"}, "c.{aggregate_type}", false},
		{[]string{"outbox.*"}, "outbox.{aggregate_type}.{event_type}", false},
		{[]string{"outbox.>"}, "outbox.{aggregate_type}.{event_type}", true},
		{[]string{"outbox.order.>"}, "outbox.{aggregate_type}.{event_type}", true}, // part of them: accepted
		{[]string{"outbox.*.*"}, "outbox.{aggregate_type}.{event_type}", true},
		{[]string{">"}, "x.{aggregate_type}", true},
		{[]string{"x.v1"}, "x.v{schema_version}", true},
		{[]string{"foo.>", "outbox.*"}, "outbox.{aggregate_type}", true},
	} {
		cfg := isolated(t, js)
		prefix := strings.TrimSuffix(cfg.StreamSubjects[0], ".>")
		for i, s := range c.subjects {
			c.subjects[i] = prefix + "." + s
		}
		cfg.StreamSubjects = c.subjects
		cfg.Subject = broker.MustParseTemplate(prefix + "." + c.template)
		p, err := nats.New(t.Context(), js, &cfg)
		var se *nats.SubjectsError
		switch {
		case c.ok && err != nil:
			t.Errorf("%v, %s: %v", c.subjects, c.template, err)
		case !c.ok && !errors.As(err, &se):
			t.Errorf("%v, %s: %v, want a *SubjectsError", c.subjects, c.template, err)
		case !c.ok:
			if _, serr := js.Stream(t.Context(), cfg.Stream); !errors.Is(serr, jetstream.ErrStreamNotFound) {
				t.Errorf("%v, %s: the stream was created: %v", c.subjects, c.template, serr)
			}
		}
		if p != nil {
			_ = p.Close()
		}
	}

	// An existing stream changed under a running publisher: every message fails
	// as unavailable (retried, readiness fails), none is refused.
	cfg := isolated(t, js)
	p := newPublisher(t, js, cfg)
	if err := publish(t, p, message("order", 1))[0]; err != nil {
		t.Fatal(err)
	}
	if _, err := js.UpdateStream(t.Context(), jetstream.StreamConfig{Name: cfg.Stream, Subjects: []string{"elsewhere-" + cfg.Stream + ".>"}}); err != nil {
		t.Fatal(err)
	}
	for i, err := range publish(t, p, message("order", 2), message("user", 1)) {
		if broker.IsPermanent(err) || !broker.IsUnavailable(err) {
			t.Errorf("message %d after the stream moved: %v, want unavailable", i, err)
		}
	}
	if err := p.Ping(t.Context()); err == nil {
		t.Error("Ping succeeds on a stream that cannot hold the template")
	}
}

// Distinct (aggregate type, event type) pairs never share a subject: the one
// that would need its value changed is refused, permanently, with the reason.
func TestAmbiguousSubjectsRefused(t *testing.T) {
	t.Parallel()
	js := sharedJetStream(t)
	cfg := isolated(t, js)
	p := newPublisher(t, js, cfg)
	pairs := []struct {
		aggType, eventType string
		ok                 bool
	}{
		{"a.b", "c", false}, {"a", "b.c", true},
		{"a.b.c", "d", false}, {"a", "b.c.d", true},
		{"x.", "y", false}, {"x", ".y", false}, // empty token
		{"a*", "c", false}, {"a>", "c", false}, {"a", "c*", false},
		{"a b", "c", false}, {"ü.ñ", "c", false}, {"ü", "ñ.c", true},
		{"日本", "注文", true}, {"", "c", false},
	}
	for i, c := range pairs {
		m := message(c.aggType, 1)
		m.AggregateID = "agg-" + string(rune('a'+i))
		m.EventType = c.eventType
		err := publish(t, p, m)[0]
		if c.ok != (err == nil) || (err != nil && !broker.IsPermanent(err)) {
			t.Errorf("%q/%q: %v, want ok=%v or a permanent refusal", c.aggType, c.eventType, err, c.ok)
		}
		if err != nil && strings.Contains(c.aggType, ".") && !errors.Is(err, broker.ErrAmbiguousDestination) {
			t.Errorf("%q/%q: %v, want ErrAmbiguousDestination", c.aggType, c.eventType, err)
		}
	}
	subjects := map[string]string{}
	for _, m := range streamMessages(t, js, cfg.Stream) {
		if prev, ok := subjects[m.Subject]; ok {
			t.Errorf("subject %s holds %s and %s", m.Subject, prev, m.Header.Get(wire.HeaderAggregateType))
		}
		subjects[m.Subject] = m.Header.Get(wire.HeaderAggregateType) + "/" + m.Header.Get(wire.HeaderEventType)
	}
	if len(subjects) != 4 {
		t.Errorf("stream subjects %v, want the 4 accepted pairs", subjects)
	}
}

func streamMessages(t *testing.T, js jetstream.JetStream, stream string) []*natsgo.Msg {
	t.Helper()
	s, err := js.Stream(t.Context(), stream)
	if err != nil {
		t.Fatal(err)
	}
	var out []*natsgo.Msg
	for seq := uint64(1); seq <= s.CachedInfo().State.LastSeq; seq++ {
		raw, err := s.GetMsg(t.Context(), seq)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, &natsgo.Msg{Subject: raw.Subject, Header: natsgo.Header(raw.Header)})
	}
	return out
}
