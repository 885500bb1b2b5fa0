package rabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/rabbitmq"
	"github.com/pgoutbox/pgoutbox/internal/logtest"
	"github.com/pgoutbox/pgoutbox/internal/rabbittest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestExchangeDeclaredIfMissing(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	name := uniqueName("pgotest")
	a.deleteExchangeAtEnd(name)
	p := dial(t, sharedURL, rabbitmq.Config{Exchange: name, Logger: quiet})

	// Redeclaring succeeds only with the same type and flags.
	if err := a.ch.ExchangeDeclare(name, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		t.Fatalf("the exchange is not a durable topic exchange: %v", err)
	}
	q := a.queue(name, "order.*")

	m := message("order", "42", 1)
	if err := publish(t, p, m)[0]; err != nil {
		t.Fatalf("Publish: %v", err)
	}
	d := a.getOne(q)
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"exchange", d.Exchange, name},
		{"routing key", d.RoutingKey, "order.created"},
		{"content type", d.ContentType, "application/json"},
		{"delivery mode", d.DeliveryMode, amqp.Persistent},
		{"message id", d.MessageId, m.EventID.String()},
		{"type", d.Type, m.EventType},
		{"timestamp", d.Timestamp.Unix(), m.OccurredAt.Unix()},
		{"body", string(d.Body), string(m.Payload)},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	want := m.WireHeaders()
	for k, v := range want {
		if got, ok := d.Headers[k].(string); !ok || got != v {
			t.Errorf("header %s = %#v, want %q", k, d.Headers[k], v)
		}
	}
	if len(d.Headers) != len(want) {
		t.Errorf("%d headers, want %d: %v", len(d.Headers), len(want), d.Headers)
	}
}

func TestExistingExchangeNotModified(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	// Not what the publisher would declare: transient, auto-delete, direct.
	ex := a.exchange(amqp.ExchangeDirect)
	q := a.queue(ex, "order.created")
	p := dial(t, sharedURL, rabbitmq.Config{Exchange: ex, Logger: quiet})
	if err := p.Ping(t.Context()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if err := publish(t, p, message("order", "42", 1))[0]; err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if n := len(a.get(q)); n != 1 {
		t.Errorf("queue holds %d messages, want 1", n)
	}
	// Redeclaring with the original settings succeeds only if unchanged.
	if err := a.ch.ExchangeDeclare(ex, amqp.ExchangeDirect, false, true, false, false, nil); err != nil {
		t.Errorf("exchange changed: %v", err)
	}
}

func TestUnroutable(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	ex := a.exchange(amqp.ExchangeTopic)
	// Only orders have a queue: invoices are unroutable.
	q := a.queue(ex, "order.*")
	p := dial(t, sharedURL, rabbitmq.Config{Exchange: ex, Logger: quiet})

	// Many aggregates of both kinds, interleaved, so that returns and confirms
	// of routable and unroutable messages are in flight together.
	var msgs []broker.Message
	for seq := int64(1); seq <= 3; seq++ {
		for i := range 100 {
			typ := "order"
			if i%2 == 1 {
				typ = "invoice"
			}
			msgs = append(msgs, message(typ, fmt.Sprintf("%s-%d", typ, i), seq))
		}
	}
	results := publish(t, p, msgs...)
	for i, err := range results {
		m := &msgs[i]
		switch {
		case m.AggregateType == "order":
			if err != nil {
				t.Errorf("%s seq %d: %v, want nil", m.AggregateID, m.AggregateSequence, err)
			}
		case m.AggregateSequence == 1:
			if !errors.Is(err, rabbitmq.ErrUnroutable) || broker.IsPermanent(err) || broker.IsUnavailable(err) {
				t.Errorf("%s seq 1: %v, want ErrUnroutable, neither permanent nor unavailable", m.AggregateID, err)
			}
		default:
			if !isPredecessorFailed(err) {
				t.Errorf("%s seq %d: %v, want ErrPredecessorFailed", m.AggregateID, m.AggregateSequence, err)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("unroutable: %v", results[1])
	if n := len(a.get(q)); n != 150 {
		t.Errorf("queue holds %d messages, want the 150 orders", n)
	}

	// Once a queue is bound, the retry passes.
	inv := msgs[1]
	a.queue(ex, "invoice.*")
	if err := publish(t, p, inv)[0]; err != nil {
		t.Errorf("retry after binding a queue: %v", err)
	}
}

func TestUnroutableWithoutAnyQueue(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	ex := a.exchange(amqp.ExchangeTopic)
	p := dial(t, sharedURL, rabbitmq.Config{Exchange: ex, Logger: quiet})
	for i, err := range publish(t, p, message("order", "1", 1), message("order", "2", 1)) {
		if !errors.Is(err, rabbitmq.ErrUnroutable) {
			t.Errorf("result %d: %v, want ErrUnroutable", i, err)
		}
	}
}

func TestRefusedMessagesArePermanent(t *testing.T) {
	t.Parallel()
	cfg, a, q := isolated(t)
	p := dial(t, sharedURL, cfg)

	longKey := message(strings.Repeat("a", 250), "1", 1)
	longName := message("order", "3", 1)
	longName.Headers["N"+strings.Repeat("n", 255)] = "v"
	bigHeader := message("order", "4", 1)
	bigHeader.Headers["Big"] = strings.Repeat("v", 200<<10) // above frame_max
	badUTF8 := message("order\xff", "5", 1)

	for name, m := range map[string]broker.Message{
		"routing key above 255 bytes":   longKey,
		"header name above 255 bytes":   longName,
		"headers above the frame size":  bigHeader,
		"routing key that is not UTF-8": badUTF8,
	} {
		err := publish(t, p, m)[0]
		if !broker.IsPermanent(err) {
			t.Errorf("%s: %v, want a permanent error", name, err)
		}
		t.Logf("%s: %v", name, err)
	}
	// An event type is also the type property, a short string.
	typeOnly := cfg
	typeOnly.RoutingKey = broker.MustParseTemplate("{aggregate_type}")
	longType := message("order", "2", 1)
	longType.EventType = strings.Repeat("t", 256)
	if err := publish(t, dial(t, sharedURL, typeOnly), longType)[0]; !broker.IsPermanent(err) || !strings.Contains(err.Error(), "type property") {
		t.Errorf("event type above 255 bytes: %v, want a permanent error", err)
	}
	// None of them reached the server, nor broke the connection.
	if err := publish(t, p, message("order", "ok", 1))[0]; err != nil {
		t.Fatalf("a valid message after the refusals: %v", err)
	}
	if n := len(a.get(q)); n != 1 {
		t.Errorf("queue holds %d messages, want 1", n)
	}
}

func TestNackIsUnavailable(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	ex := a.exchange(amqp.ExchangeTopic)
	// A queue that holds one message and refuses more: the server nacks them.
	q, err := a.ch.QueueDeclare("", false, true, true, false, amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.ch.QueueBind(q.Name, "#", ex, false, nil); err != nil {
		t.Fatal(err)
	}
	p := dial(t, sharedURL, rabbitmq.Config{Exchange: ex, Logger: quiet})
	if err := publish(t, p, message("order", "1", 1))[0]; err != nil {
		t.Fatalf("first message: %v", err)
	}
	err = publish(t, p, message("order", "2", 1))[0]
	if !broker.IsUnavailable(err) || !strings.Contains(err.Error(), "nack") {
		t.Errorf("message to a full queue: %v, want an unavailable nack", err)
	}
}

func TestConcurrentPublish(t *testing.T) {
	t.Parallel()
	cfg, a, q := isolated(t)
	cfg.MaxPending = 64 // below what the workers put in flight, so they wait for slots
	p := dial(t, sharedURL, cfg)

	const workers, rounds, aggregates = 6, 5, 20
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				var msgs []broker.Message
				for i := range aggregates {
					msgs = append(msgs, message(fmt.Sprintf("w%d", w), fmt.Sprintf("a%d", i), int64(2*r+1)), message(fmt.Sprintf("w%d", w), fmt.Sprintf("a%d", i), int64(2*r+2)))
				}
				for i, err := range publish(t, p, msgs...) {
					if err != nil {
						t.Errorf("worker %d round %d result %d: %v", w, r, i, err)
					}
				}
			}
		})
	}
	wg.Wait()
	got := a.get(q)
	if want := workers * rounds * aggregates * 2; len(got) != want {
		t.Fatalf("queue holds %d messages, want %d", len(got), want)
	}
	next := map[string]int64{}
	for _, d := range got {
		agg := d.Headers[wire.HeaderAggregateType].(string) + "/" + d.Headers[wire.HeaderAggregateID].(string)
		seq := d.Headers[wire.HeaderAggregateSequence].(string)
		if want := next[agg] + 1; seq != fmt.Sprint(want) {
			t.Errorf("%s: sequence %s stored after %d", agg, seq, next[agg])
		}
		next[agg]++
	}
}

func TestDialUnreachableIsUnavailable(t *testing.T) {
	t.Parallel()
	start := time.Now()
	p, err := rabbitmq.Dial(t.Context(), "amqp://guest:guest@127.0.0.1:1/", &rabbitmq.Config{Logger: quiet})
	if err != nil {
		t.Fatalf("Dial: %v; an unreachable server must not be fatal", err)
	}
	defer p.Close()
	brokertest.CheckUnreachable(t, p, message("order", "1", 1), message("order", "1", 2), message("invoice", "1", 1))
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %s to report an unreachable server", d)
	}
}

func TestDialBeforeServerStarts(t *testing.T) {
	t.Parallel()
	cfg, a, q := isolated(t)
	prx := newProxy(t, sharedAddr(t)) // not listening yet
	p := dial(t, withHost(t, prx.addr), cfg)
	if err := publish(t, p, message("order", "1", 1))[0]; !broker.IsUnavailable(err) {
		t.Fatalf("before the server is reachable: %v, want unavailable", err)
	}
	if err := prx.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "connect once the server is reachable", func() bool { return p.Ping(t.Context()) == nil })
	if err := publish(t, p, message("order", "1", 1))[0]; err != nil {
		t.Fatalf("once the server is reachable: %v", err)
	}
	if n := len(a.get(q)); n != 1 {
		t.Errorf("queue holds %d messages, want 1", n)
	}
}

// TestServerClosesConnection has the server close the publisher's connection
// (rabbitmqctl close_connection, as an operator or a node shutting down would)
// while a batch is in flight.
func TestServerClosesConnection(t *testing.T) {
	t.Parallel()
	ctl := rabbittest.NewCtl(t)
	cfg, a, q := isolated(t)
	g := newGate()
	cfg.DialContext = g.dialer
	cfg.ConnectionName = uniqueName("pgoutbox-test")
	logs := &logtest.Buffer{}
	cfg.Logger = logs.Logger()
	p := dial(t, sharedURL, cfg)

	acked := map[string]bool{}
	for _, m := range []broker.Message{message("order", "a", 1), message("order", "b", 1)} {
		if err := publish(t, p, m)[0]; err != nil {
			t.Fatalf("before the close: %v", err)
		}
		acked[m.EventID.String()] = true
	}
	pid := ctl.ConnectionPID(t, cfg.ConnectionName)

	// Hold the publisher's writes, so that the batch is in flight (handed to
	// the client, not confirmed) when the server closes the connection.
	g.holdWrites()
	inFlight := []broker.Message{message("order", "a", 2), message("order", "c", 1), message("order", "c", 2)}
	done := make(chan []error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		done <- p.Publish(ctx, inFlight)
	}()
	select {
	case <-g.heldWrites:
	case <-time.After(10 * time.Second):
		t.Fatal("the publisher wrote nothing")
	}
	ctl.CloseConnection(t, pid, "pgoutbox test")
	g.release()

	var results []error
	select {
	case results = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Publish did not return after the connection was closed")
	}
	for i, err := range results {
		m := &inFlight[i]
		switch {
		case m.AggregateSequence == 2 && m.AggregateID == "c":
			if err == nil || broker.IsPermanent(err) {
				t.Errorf("%s seq %d: %v, want a retryable error", m.AggregateID, m.AggregateSequence, err)
			}
		case !broker.IsUnavailable(err):
			t.Errorf("%s seq %d in flight at the close: %v, want unavailable", m.AggregateID, m.AggregateSequence, err)
		}
	}
	t.Logf("in flight at the close: %v", results[0])

	// The publisher reconnects by itself; later publishes succeed.
	after := message("order", "d", 1)
	wait.For(t, 15*time.Second, "publish after the connection was closed", func() bool {
		return publish(t, p, after)[0] == nil
	})
	acked[after.EventID.String()] = true

	stored := map[string]bool{}
	for _, d := range a.get(q) {
		stored[d.MessageId] = true
	}
	for id := range acked {
		if !stored[id] {
			t.Errorf("event %s was acked but is not in the queue", id)
		}
	}
	if out := logs.String(); !strings.Contains(out, "connection lost") || !strings.Contains(out, "CONNECTION_FORCED") {
		t.Errorf("the loss was not logged with its reason:\n%s", out)
	}
}

func TestChannelLossReopensChannel(t *testing.T) {
	t.Parallel()
	cfg, a, q := isolated(t)
	logs := &logtest.Buffer{}
	cfg.Logger = logs.Logger()
	p := dial(t, sharedURL, cfg)
	if err := publish(t, p, message("order", "1", 1))[0]; err != nil {
		t.Fatal(err)
	}
	// Publishing to a deleted exchange closes the channel (404 NOT_FOUND).
	if err := a.ch.ExchangeDelete(cfg.Exchange, false, false); err != nil {
		t.Fatal(err)
	}
	err := publish(t, p, message("order", "1", 2))[0]
	if !broker.IsUnavailable(err) || !strings.Contains(err.Error(), "NOT_FOUND") {
		t.Fatalf("exchange deleted: %v, want unavailable, NOT_FOUND", err)
	}
	// The publisher reopens a channel, which declares the exchange again.
	wait.For(t, 10*time.Second, "exchange declared again", func() bool { return p.Ping(t.Context()) == nil })
	if err := a.ch.QueueBind(q, "#", cfg.Exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := publish(t, p, message("order", "1", 2))[0]; err != nil {
		t.Fatalf("after the channel was reopened: %v", err)
	}
	if n := len(a.get(q)); n != 2 {
		t.Errorf("queue holds %d messages, want 2", n)
	}
	out := logs.String()
	if !strings.Contains(out, "channel lost") || strings.Contains(out, "connection lost") {
		t.Errorf("want the channel reopened on the same connection; log:\n%s", out)
	}
}

func TestConfirmTimeout(t *testing.T) {
	t.Parallel()
	cfg, a, q := isolated(t)
	g := newGate()
	cfg.DialContext = g.dialer
	cfg.ConfirmTimeout = 300 * time.Millisecond
	p := dial(t, sharedURL, cfg)
	if err := publish(t, p, message("order", "1", 1))[0]; err != nil {
		t.Fatal(err)
	}

	// The server's answers stop coming, as in a network partition.
	g.holdReads()
	start := time.Now()
	err := publish(t, p, message("order", "1", 2))[0]
	if !broker.IsUnavailable(err) || !strings.Contains(err.Error(), "no confirm") {
		t.Errorf("no confirm: %v, want unavailable", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %s to give up on a confirm due after %s", d, cfg.ConfirmTimeout)
	}
	// The publisher dropped the connection; once the network is back, it has
	// a new one.
	g.release()
	m := message("order", "1", 2)
	wait.For(t, 15*time.Second, "publish after the partition", func() bool { return publish(t, p, m)[0] == nil })
	if n := len(a.get(q)); n < 2 || n > 3 {
		t.Errorf("queue holds %d messages, want 2 or 3 (the unconfirmed one may be stored)", n)
	}
}

func TestDialMalformedURL(t *testing.T) {
	t.Parallel()
	const secret = "s3cret-pw"
	for _, url := range []string{
		"",
		"   ",
		"amqp://guest:" + secret + "@127.0.0.1:notaport/",
		"amqp://guest:" + secret + "@127.0.0.1:99999/",
		"amqp://guest:" + secret + "@127.0.0.1:/",
		"http://guest:" + secret + "@127.0.0.1:5672/",
		"amqp://guest:" + secret + "@[::1/",
		"amqp:guest:" + secret + "@127.0.0.1",
		"amqp://guest:" + secret + "@/vhost",
		"amqp://guest:" + secret + " @127.0.0.1/",
		"amqp://guest:" + secret + "@127.0.0.1/?hearbeat=5",
		"amqp://guest:" + secret + "@127.0.0.1/?heartbeat=soon",
		"amqp://guest:" + secret + "@127.0.0.1/?connection_timeout=-1",
		"amqp://guest:" + secret + "@127.0.0.1/?auth_mechanism=kerberos",
		"amqps://guest:" + secret + "@127.0.0.1/?cacertfile=/nonexistent/ca.pem",
		"amqp://gu%zzest:" + secret + "@127.0.0.1/",
	} {
		p, err := rabbitmq.Dial(t.Context(), url, &rabbitmq.Config{Logger: quiet})
		if err == nil {
			p.Close()
			t.Errorf("Dial(%q): no error", url)
			continue
		}
		if msg := err.Error(); strings.Contains(msg, secret) || strings.Contains(msg, "\n") {
			t.Errorf("Dial(%q): error %q shows the password or spans lines", url, msg)
		}
		t.Logf("%q: %v", url, err)
	}
}

func TestDialRefused(t *testing.T) {
	t.Parallel()
	const secret = "wrong-pw-1234"
	for url, want := range map[string]string{
		"amqp://guest:" + secret + "@" + sharedAddr(t) + "/":                      "username or password",
		"amqp://guest:guest@" + sharedAddr(t) + "/" + uniqueName("no-such-vhost"): "not found",
	} {
		p, err := rabbitmq.Dial(t.Context(), url, &rabbitmq.Config{Logger: quiet})
		if err == nil {
			p.Close()
			t.Errorf("Dial(%s): no error", url)
			continue
		}
		if !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), secret) {
			t.Errorf("Dial: %v; want it to say %q, without the password", err, want)
		}
		t.Logf("%v", err)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	for field, cfg := range map[string]rabbitmq.Config{
		"Config.Exchange":            {Exchange: "out box"},
		"Config.ConfirmTimeout":      {ConfirmTimeout: -time.Second},
		"Config.MaxPending":          {MaxPending: -1},
		"Config.ConnectTimeout":      {ConnectTimeout: -time.Second},
		"Config.ReconnectBackoff":    {ReconnectBackoff: -time.Second},
		"Config.MaxReconnectBackoff": {ReconnectBackoff: time.Minute, MaxReconnectBackoff: time.Second},
		"Config.ConnectionName":      {ConnectionName: strings.Repeat("n", 300)},
	} {
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: Validate: %v does not name the field", field, err)
		}
		cfg.Logger = quiet
		_, err := rabbitmq.Dial(t.Context(), "amqp://127.0.0.1:1/", &cfg)
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: error %v does not name the field", field, err)
		}
	}
	var nilCfg *rabbitmq.Config
	if err := nilCfg.Validate(); err != nil {
		t.Errorf("nil Config: %v", err)
	}
	// Zero fields stand for their defaults: a cap below the default first
	// backoff is refused, one above a zero ReconnectBackoff's default is not.
	if err := (&rabbitmq.Config{MaxReconnectBackoff: time.Second}).Validate(); err != nil {
		t.Errorf("MaxReconnectBackoff above the default ReconnectBackoff: %v", err)
	}
	if err := (&rabbitmq.Config{MaxReconnectBackoff: time.Millisecond}).Validate(); err == nil {
		t.Error("MaxReconnectBackoff below the default ReconnectBackoff: no error")
	}
	err := (&rabbitmq.Config{ConfirmTimeout: -1, MaxPending: -1}).Validate()
	if err == nil || !strings.Contains(err.Error(), "Config.ConfirmTimeout") || !strings.Contains(err.Error(), "Config.MaxPending") {
		t.Errorf("two invalid fields: %v, want both named", err)
	}
}

func TestClosedPublisherFails(t *testing.T) {
	t.Parallel()
	cfg, _, _ := isolated(t)
	p := dial(t, sharedURL, cfg)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := publish(t, p, message("order", "1", 1))[0]; !broker.IsUnavailable(err) {
		t.Errorf("Publish after Close: %v, want unavailable", err)
	}
	if err := p.Ping(t.Context()); !broker.IsUnavailable(err) {
		t.Errorf("Ping after Close: %v, want unavailable", err)
	}
}

func TestCloseDuringPublish(t *testing.T) {
	t.Parallel()
	cfg, _, _ := isolated(t)
	g := newGate()
	cfg.DialContext = g.dialer
	p := dial(t, sharedURL, cfg)
	g.holdReads() // no confirm will come
	done := make(chan []error, 1)
	go func() {
		done <- p.Publish(context.Background(), []broker.Message{message("order", "1", 1), message("invoice", "1", 1)})
	}()
	// Close waits for the server to answer the close; let it.
	closed := make(chan struct{})
	go func() { _ = p.Close(); close(closed) }()
	select {
	case results := <-done:
		for i, err := range results {
			if !broker.IsUnavailable(err) {
				t.Errorf("result %d: %v, want unavailable", i, err)
			}
		}
	case <-time.After(10 * time.Second):
		t.Error("Publish did not return after Close")
	}
	g.release()
	<-closed
}

// Distinct (aggregate type, event type) pairs never share a routing key: the
// pair whose value would need changing is refused, permanently, with the reason.
func TestAmbiguousRoutingKeysRefused(t *testing.T) {
	t.Parallel()
	cfg, a, q := isolated(t)
	p := dial(t, sharedURL, cfg)
	accepted := 0
	for i, pair := range []struct {
		aggType, eventType string
		ok                 bool
	}{
		{"a.b", "c", false}, {"a", "b.c", true}, {"x.y.z", "w", false}, {"x", "y.z.w", true},
		{"", "c", false}, {"a", "", false}, {"a#", "c", true}, {"a*", "c.d", true}, {"ü", "ñ", true},
	} {
		m := message(pair.aggType, fmt.Sprintf("agg-%d", i), 1)
		m.EventType = pair.eventType
		err := publish(t, p, m)[0]
		if pair.ok != (err == nil) || (err != nil && (!broker.IsPermanent(err) || !errors.Is(err, broker.ErrAmbiguousDestination))) {
			t.Errorf("%q/%q: %v, want ok=%v or a permanent ErrAmbiguousDestination", pair.aggType, pair.eventType, err, pair.ok)
		}
		if err == nil {
			accepted++
		}
	}
	if n := len(a.get(q)); n != accepted {
		t.Errorf("queue holds %d messages, want %d", n, accepted)
	}
}
