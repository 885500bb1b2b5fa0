package nats_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/nats"
	"github.com/pgoutbox/pgoutbox/broker/nats/natsembed"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// sharedURL is the NATS server with JetStream that the test machine runs
// (PGOUTBOX_TEST_NATS_URL overrides it). Tests never stop it; each works in a
// stream and subjects of its own and deletes them.
var sharedURL = cmp.Or(os.Getenv("PGOUTBOX_TEST_NATS_URL"), "nats://127.0.0.1:4222")

var quiet = slog.New(slog.DiscardHandler)

func sharedJetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	nc, err := natsgo.Connect(sharedURL)
	if err != nil {
		t.Fatalf("connect to the shared NATS server %s: %v", sharedURL, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// isolated returns a Config on a stream and subject prefix of the test's own,
// and deletes the stream when the test ends.
func isolated(t *testing.T, js jetstream.JetStream) nats.Config {
	t.Helper()
	var r [5]byte
	_, _ = rand.Read(r[:])
	suffix := hex.EncodeToString(r[:])
	prefix := "pgotest_" + suffix
	stream := "PGOUTBOX_TEST_" + strings.ToUpper(suffix)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("delete stream %s: %v", stream, err)
		}
	})
	return nats.Config{
		Stream:         stream,
		StreamSubjects: []string{prefix + ".>"},
		Subject:        broker.MustParseTemplate(prefix + ".{aggregate_type}.{event_type}"),
		Logger:         quiet,
	}
}

func newPublisher(t *testing.T, js jetstream.JetStream, cfg nats.Config) *nats.Publisher {
	t.Helper()
	p, err := nats.New(t.Context(), js, &cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func message(aggType string, seq int64) broker.Message {
	return brokertest.Message(aggType, "order-42", seq)
}

func publish(t *testing.T, p broker.Publisher, msgs ...broker.Message) []error {
	t.Helper()
	return brokertest.Publish(t, p, msgs...)
}

func streamInfo(t *testing.T, js jetstream.JetStream, name string) *jetstream.StreamInfo {
	t.Helper()
	s, err := js.Stream(t.Context(), name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	return s.CachedInfo()
}

func TestStreamCreatedIfMissing(t *testing.T) {
	t.Parallel()
	js := sharedJetStream(t)
	cfg := isolated(t, js)
	p := newPublisher(t, js, cfg)

	info := streamInfo(t, js, cfg.Stream)
	if got := info.Config.Subjects; len(got) != 1 || got[0] != cfg.StreamSubjects[0] {
		t.Errorf("stream subjects = %v, want %v", got, cfg.StreamSubjects)
	}
	if info.Config.Storage != jetstream.FileStorage {
		t.Errorf("stream storage = %v, want file", info.Config.Storage)
	}

	m := message("order", 1)
	got := publishFirst(t, p, js, cfg.Stream, m)
	wantSubject := strings.TrimSuffix(cfg.StreamSubjects[0], ">") + "order.created"
	if got.Subject != wantSubject {
		t.Errorf("subject = %q, want %q", got.Subject, wantSubject)
	}
	if string(got.Data) != string(m.Payload) {
		t.Errorf("body = %q, want %q", got.Data, m.Payload)
	}
	for k, want := range m.WireHeaders() {
		if v := got.Header.Values(k); len(v) != 1 || v[0] != want {
			t.Errorf("header %s = %q, want [%q]", k, v, want)
		}
	}
	if id := got.Header.Get(jetstream.MsgIDHeader); id != m.EventID.String() {
		t.Errorf("%s = %q, want the event id %s", jetstream.MsgIDHeader, id, m.EventID)
	}
}

func TestExistingStreamNotModified(t *testing.T) {
	t.Parallel()
	js := sharedJetStream(t)
	cfg := isolated(t, js)
	prefix := strings.TrimSuffix(cfg.StreamSubjects[0], ".>")
	existing := jetstream.StreamConfig{
		Name:       cfg.Stream,
		Subjects:   []string{prefix + ".a.>", prefix + ".b.>"},
		Storage:    jetstream.MemoryStorage,
		MaxMsgs:    100,
		Duplicates: 30 * time.Second,
	}
	if _, err := js.CreateStream(t.Context(), existing); err != nil {
		t.Fatal(err)
	}
	before := streamInfo(t, js, cfg.Stream).Config
	p := newPublisher(t, js, cfg)

	// "a" is in the stream; "c" is not, which is the event's fault, not an outage.
	results := publish(t, p, message("a", 1), message("c", 1), message("c", 2))
	if results[0] != nil {
		t.Errorf("subject in the stream: %v", results[0])
	}
	if !broker.IsPermanent(results[1]) {
		t.Errorf("subject outside the stream: %v, want a permanent error", results[1])
	}
	if !errors.Is(results[2], broker.ErrPredecessorFailed) {
		t.Errorf("next event of the refused aggregate: %v, want ErrPredecessorFailed", results[2])
	}
	if err := p.Ping(t.Context()); err != nil {
		t.Errorf("Ping: %v", err)
	}

	after := streamInfo(t, js, cfg.Stream).Config
	if strings.Join(after.Subjects, ",") != strings.Join(before.Subjects, ",") ||
		after.Storage != before.Storage || after.MaxMsgs != before.MaxMsgs || after.Duplicates != before.Duplicates {
		t.Errorf("stream config changed:\nbefore %+v\nafter  %+v", before, after)
	}
}

func TestDuplicateWithinWindowStoredOnce(t *testing.T) {
	t.Parallel()
	js := sharedJetStream(t)
	cfg := isolated(t, js)
	p := newPublisher(t, js, cfg)

	m := message("order", 1)
	for round := range 3 {
		if err := publish(t, p, m)[0]; err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
	state := streamInfo(t, js, cfg.Stream).State
	if state.Msgs != 1 || state.LastSeq != 1 {
		t.Errorf("stream holds %d messages, last sequence %d; want 1 and 1", state.Msgs, state.LastSeq)
	}
}

// dedupWindowShort is the duplicate window of the stream in
// TestDuplicateAfterWindowStoredTwice: an outage that outlasts it.
const dedupWindowShort = 500 * time.Millisecond

// A re-publish after the stream's duplicate window (Duplicates) has passed is
// stored again: an outage or a crash that kept an acknowledged-but-unmarked event
// in the outbox longer than the window puts it on the stream twice, with the
// same event id, for the consumers' inbox to absorb. Within the window it is
// dropped.
func TestDuplicateAfterWindowStoredTwice(t *testing.T) {
	t.Parallel()
	js := sharedJetStream(t)
	cfg := isolated(t, js)
	_, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: cfg.Stream, Subjects: cfg.StreamSubjects,
		Duplicates: dedupWindowShort})
	if err != nil {
		t.Fatalf("create stream: %v", err)
	}
	p := newPublisher(t, js, cfg)

	m := message("order", 1)
	start := time.Now()
	for i := range 2 {
		if err := publish(t, p, m)[0]; err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	if n := streamInfo(t, js, cfg.Stream).State.Msgs; n != 1 && time.Since(start) < dedupWindowShort {
		t.Fatalf("within the window the stream holds %d messages, want 1", n)
	}
	// Re-publish until the window has passed for the stored message.
	wait.For(t, 20*dedupWindowShort, "a re-publish after the window to be stored", func() bool {
		if err := publish(t, p, m)[0]; err != nil {
			t.Fatalf("re-publish: %v", err)
		}
		return streamInfo(t, js, cfg.Stream).State.Msgs == 2
	})
	if elapsed := time.Since(start); elapsed < dedupWindowShort {
		t.Fatalf("stored again after %s, within the %s window", elapsed, dedupWindowShort)
	}
	s, err := js.Stream(t.Context(), cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 2; seq++ {
		got, err := s.GetMsg(t.Context(), seq)
		if err != nil {
			t.Fatalf("get message %d: %v", seq, err)
		}
		if id := got.Header.Get(wire.HeaderEventID); id != m.EventID.String() {
			t.Errorf("message %d: %s = %q, want %s", seq, wire.HeaderEventID, id, m.EventID)
		}
	}
}

// A replay inside the duplicate window is stored again when it carries its own
// DedupID, while consumers still see the original event id; repeating the same
// DedupID is dropped like any duplicate.
func TestDedupIDStoresReplayWithinWindow(t *testing.T) {
	t.Parallel()
	js := sharedJetStream(t)
	cfg := isolated(t, js)
	p := newPublisher(t, js, cfg)

	m := message("order", 1)
	replay := m
	replay.DedupID = m.EventID.String() + ":replay:1"
	for i, msg := range []broker.Message{m, replay, replay} {
		if err := publish(t, p, msg)[0]; err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	if n := streamInfo(t, js, cfg.Stream).State.Msgs; n != 2 {
		t.Fatalf("stream holds %d messages, want 2 (original and one replay)", n)
	}
	s, err := js.Stream(t.Context(), cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	for seq, wantDedup := range map[uint64]string{1: m.EventID.String(), 2: replay.DedupID} {
		got, err := s.GetMsg(t.Context(), seq)
		if err != nil {
			t.Fatalf("get message %d: %v", seq, err)
		}
		if id := got.Header.Get(wire.HeaderEventID); id != m.EventID.String() {
			t.Errorf("message %d: %s = %q, want %s", seq, wire.HeaderEventID, id, m.EventID)
		}
		if id := got.Header.Get(jetstream.MsgIDHeader); id != wantDedup {
			t.Errorf("message %d: %s = %q, want %q", seq, jetstream.MsgIDHeader, id, wantDedup)
		}
	}
}

func TestRefusedMessagesArePermanent(t *testing.T) {
	t.Parallel()
	js := sharedJetStream(t)
	cfg := isolated(t, js)
	// A stream limit below the server's max payload, so the server refuses it.
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{
		Name: cfg.Stream, Subjects: cfg.StreamSubjects, Storage: jetstream.MemoryStorage, MaxMsgSize: 4096,
	}); err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, js, cfg)

	overStream := message("big", 1)
	overStream.Payload = []byte(`"` + strings.Repeat("x", 8<<10) + `"`)
	overServer := message("huge", 1)
	overServer.Payload = []byte(`"` + strings.Repeat("x", int(js.Conn().MaxPayload())) + `"`)
	badType := message("order", 1)
	badType.EventType = "created*"
	emptyToken := message("", 1)
	badHeader := message("order", 1)
	badHeader.AggregateID = "other"
	badHeader.Headers["Multi"] = "line\nbreak"
	badHeaderName := message("order", 1)
	badHeaderName.AggregateID = "third"
	badHeaderName.Headers["Bad Name"] = "v"

	cases := map[string]broker.Message{
		"above the stream's max message size": overStream,
		"above the server's max payload":      overServer,
		"wildcard in the subject":             badType,
		"empty subject token":                 emptyToken,
		"header that would be altered":        badHeader,
		"header name with a space":            badHeaderName,
	}
	for name, m := range cases {
		if err := publish(t, p, m)[0]; !broker.IsPermanent(err) {
			t.Errorf("%s: %v, want a permanent error", name, err)
		}
	}
	if n := streamInfo(t, js, cfg.Stream).State.Msgs; n != 0 {
		t.Errorf("stream holds %d messages, want 0", n)
	}
}

func TestDialUnreachableIsUnavailable(t *testing.T) {
	t.Parallel()
	start := time.Now()
	p, err := nats.Dial(t.Context(), "nats://127.0.0.1:1", &nats.Config{Logger: quiet})
	if err != nil {
		t.Fatalf("Dial: %v; an unreachable server must not be fatal", err)
	}
	defer p.Close()
	brokertest.CheckUnreachable(t, p, message("order", 1), message("order", 2), message("invoice", 1))
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %s to report an unreachable server", d)
	}
}

func TestDialBeforeServerStarts(t *testing.T) {
	t.Parallel()
	port := brokertest.FreePort(t)

	connected := make(chan struct{})
	p, err := nats.Dial(t.Context(), "nats://127.0.0.1:"+strconv.Itoa(port), &nats.Config{
		Logger: quiet,
		DialOptions: []natsgo.Option{
			natsgo.ReconnectWait(20 * time.Millisecond),
			natsgo.ConnectHandler(func(*natsgo.Conn) { close(connected) }),
		},
	})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer p.Close()
	if err := publish(t, p, message("order", 1))[0]; !broker.IsUnavailable(err) {
		t.Fatalf("before the server starts: %v, want unavailable", err)
	}

	srv, err := natsembed.New(&natsembed.Config{StoreDir: t.TempDir(), Port: port})
	if err != nil {
		t.Fatalf("natsembed.New: %v", err)
	}
	defer srv.Shutdown()
	select {
	case <-connected:
	case <-time.After(10 * time.Second):
		t.Fatal("publisher did not connect within 10s of the server starting")
	}
	// The stream is ensured lazily, by the first publish after connecting.
	if err := publish(t, p, message("order", 1))[0]; err != nil {
		t.Fatalf("after the server started: %v", err)
	}
}

func TestDialMalformedURL(t *testing.T) {
	t.Parallel()
	for _, url := range []string{"", "nats://127.0.0.1:notaport", "http://127.0.0.1:4222", "nats://127.0.0.1:99999", "nats://[::1"} {
		if p, err := nats.Dial(t.Context(), url, &nats.Config{Logger: quiet}); err == nil {
			p.Close()
			t.Errorf("Dial(%q): no error", url)
		}
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	for field, cfg := range map[string]nats.Config{
		"Config.Stream":         {Stream: "OUT.BOX"},
		"Config.StreamSubjects": {StreamSubjects: []string{"outbox..x"}},
		"Config.AckTimeout":     {AckTimeout: -time.Second},
		"Config.MaxPending":     {MaxPending: -1},
	} {
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: Validate: %v does not name the field", field, err)
		}
		cfg.Logger = quiet
		_, err := nats.Dial(t.Context(), "nats://127.0.0.1:1", &cfg)
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: error %v does not name the field", field, err)
		}
	}
	var nilCfg *nats.Config
	if err := nilCfg.Validate(); err != nil {
		t.Errorf("nil Config: %v", err)
	}
	if err := (&nats.Config{}).Validate(); err != nil {
		t.Errorf("zero Config: %v", err)
	}
	err := (&nats.Config{AckTimeout: -1, MaxPending: -1}).Validate()
	if err == nil || !strings.Contains(err.Error(), "Config.AckTimeout") || !strings.Contains(err.Error(), "Config.MaxPending") {
		t.Errorf("two invalid fields: %v, want both named", err)
	}
}

func TestClosedPublisherFails(t *testing.T) {
	t.Parallel()
	js := sharedJetStream(t)
	cfg := isolated(t, js)
	p := newPublisher(t, js, cfg)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := publish(t, p, message("order", 1))[0]; !broker.IsUnavailable(err) {
		t.Errorf("Publish after Close: %v, want unavailable", err)
	}
	if !js.Conn().IsConnected() {
		t.Error("Close closed a connection the publisher does not own")
	}
}

func TestStreamRecheckedAfterFailure(t *testing.T) {
	t.Parallel()
	js := sharedJetStream(t)
	cfg := isolated(t, js)
	p := newPublisher(t, js, cfg)
	if err := publish(t, p, message("order", 1))[0]; err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(t.Context(), cfg.Stream); err != nil {
		t.Fatal(err)
	}
	// Nothing listens on the subject now: an outage, not the event's fault.
	if err := publish(t, p, message("order", 2))[0]; !broker.IsUnavailable(err) {
		t.Fatalf("stream deleted: %v, want unavailable", err)
	}
	// The failure made the publisher look the stream up again, and create it.
	if err := publish(t, p, message("order", 2))[0]; err != nil {
		t.Fatalf("after the failure: %v", err)
	}
	if n := streamInfo(t, js, cfg.Stream).State.Msgs; n != 1 {
		t.Errorf("recreated stream holds %d messages, want 1", n)
	}
}

// publishFirst publishes m, the first message of stream, and returns it as the
// stream stored it.
func publishFirst(t *testing.T, p *nats.Publisher, js jetstream.JetStream, stream string, m broker.Message) *jetstream.RawStreamMsg {
	t.Helper()
	if err := publish(t, p, m)[0]; err != nil {
		t.Fatalf("Publish: %v", err)
	}
	s, err := js.Stream(t.Context(), stream)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.GetMsg(t.Context(), 1)
	if err != nil {
		t.Fatalf("get message 1: %v", err)
	}
	return got
}
