package kafka_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/kafka"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/wire"
)

// fastRetries make the client retry at once in tests where the cluster fails
// requests on purpose; franz-go's defaults back off for up to seconds.
var fastRetries = []kgo.Opt{
	kgo.RetryBackoffFn(func(int) time.Duration { return 5 * time.Millisecond }),
	kgo.MetadataMinAge(10 * time.Millisecond),
}

func TestRecordShape(t *testing.T) {
	t.Parallel()
	c := newCluster(t, false)
	p := c.dial(kafka.Config{})
	custom := c.dial(kafka.Config{Topic: broker.MustParseTemplate("events.{aggregate_type}.v{schema_version}")})

	m := message("order", "order-42", 1)
	for _, name := range []string{"Outbox-Event-Id", "nats-rollup", "X-Death"} {
		spoofed := message("order", "order-spoof", 1)
		spoofed.Headers[name] = "spoofed"
		if err := publish(t, p, spoofed)[0]; !broker.IsPermanent(err) {
			t.Fatalf("a producer header %s: %v, want a permanent refusal", name, err)
		}
	}
	if err := publish(t, p, m)[0]; err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if err := publish(t, custom, message("order", "order-42", 2))[0]; err != nil {
		t.Fatalf("Publish with a custom topic template: %v", err)
	}

	recs := read(t, c)
	if len(recs) != 2 {
		t.Fatalf("stored %d records, want 2", len(recs))
	}
	if recs[0].Topic != "events.order.v1" {
		t.Errorf("custom template: topic %q, want events.order.v1", recs[0].Topic)
	}
	r := recs[1]
	if r.Topic != "outbox.order" {
		t.Errorf("topic %q, want outbox.order", r.Topic)
	}
	if string(r.Key) != m.AggregateID {
		t.Errorf("key %q, want the aggregate id %q", r.Key, m.AggregateID)
	}
	if string(r.Value) != string(m.Payload) {
		t.Errorf("value %q, want %q", r.Value, m.Payload)
	}
	want := m.WireHeaders()
	var names []string
	for _, h := range r.Headers {
		names = append(names, h.Key)
		if w, ok := want[h.Key]; !ok {
			t.Errorf("unexpected header %s=%q", h.Key, h.Value)
		} else if string(h.Value) != w {
			t.Errorf("header %s = %q, want %q", h.Key, h.Value, w)
		}
	}
	if len(names) != len(want) {
		t.Errorf("headers %v, want the %d wire headers once each", names, len(want))
	}
	if !slices.IsSorted(names) {
		t.Errorf("headers %v are not sorted by name", names)
	}
	// Kafka's Java client puts the key in the same partition (murmur2).
	if want := javaPartition(r.Key, 4); r.Partition != want {
		t.Errorf("partition %d, want %d (murmur2 of the key, as Kafka's clients compute it)", r.Partition, want)
	}
}

// javaPartition is the partition Kafka's default partitioner picks for key.
func javaPartition(key []byte, partitions int) int32 {
	return int32(kgo.StickyKeyPartitioner(nil).ForTopic("").Partition(&kgo.Record{Key: key}, partitions))
}

func TestAggregateOrderUnderTransientErrors(t *testing.T) {
	t.Parallel()
	const (
		topic        = "outbox.order"
		partitions   = 8
		aggregates   = 50
		perAggregate = 20
	)
	c := newCluster(t, false)
	c.createTopic(topic, partitions, nil)
	// Fail some partitions of some produce requests with retriable errors.
	// REQUEST_TIMED_OUT is answered after the records were appended, so the
	// client's retry must be recognised as a duplicate.
	every := func(n int64) func(kmsg.Request) bool {
		var calls atomic.Int64 // When runs on the cluster's goroutine, but -race cannot know
		return func(kmsg.Request) bool { return calls.Add(1)%n == 0 }
	}
	var faults []*kfake.FaultHandle
	for _, f := range []struct {
		err   *kerr.Error
		every int64
	}{{kerr.NotEnoughReplicas, 5}, {kerr.NotLeaderForPartition, 7}, {kerr.RequestTimedOut, 11}} {
		faults = append(faults, c.kfake().Fault(kfake.Fault{
			Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: f.err, Count: -1, When: every(f.every),
		}))
	}
	p := c.dial(kafka.Config{DialOptions: fastRetries})

	var msgs []broker.Message
	for seq := int64(1); seq <= perAggregate; seq++ {
		for a := range aggregates {
			msgs = append(msgs, message("order", fmt.Sprintf("order-%02d", a), seq))
		}
	}
	for i, err := range publish(t, p, msgs...) {
		if err != nil {
			t.Fatalf("result %d (%s seq %d): %v", i, msgs[i].AggregateID, msgs[i].AggregateSequence, err)
		}
	}
	for i, f := range faults {
		if f.Hits() == 0 {
			t.Errorf("fault %d was never injected", i)
		}
		f.Remove()
	}

	recs := read(t, c, topic)
	if len(recs) != len(msgs) {
		t.Errorf("stored %d records, want %d: retries must neither lose nor duplicate records", len(recs), len(msgs))
	}
	partitionOf := map[string]int32{}
	next := map[string]int64{}
	for _, r := range recs { // each partition in offset order
		key := string(r.Key)
		if p, ok := partitionOf[key]; ok && p != r.Partition {
			t.Errorf("aggregate %s in partitions %d and %d", key, p, r.Partition)
		}
		partitionOf[key] = r.Partition
		seq, _ := strconv.ParseInt(header(r, wire.HeaderAggregateSequence), 10, 64)
		if want := next[key] + 1; seq != want {
			t.Errorf("aggregate %s: offset %d of partition %d holds sequence %d, want %d", key, r.Offset, r.Partition, seq, want)
		}
		next[key] = seq
	}
	for key, part := range partitionOf {
		if want := javaPartition([]byte(key), partitions); part != want {
			t.Errorf("aggregate %s in partition %d, want %d", key, part, want)
		}
	}
	if len(partitionOf) != aggregates {
		t.Errorf("stored records of %d aggregates, want %d", len(partitionOf), aggregates)
	}
	used := map[int32]bool{}
	for _, part := range partitionOf {
		used[part] = true
	}
	if len(used) < partitions/2 {
		t.Errorf("%d aggregates used only %d of %d partitions", aggregates, len(used), partitions)
	}
}

// TestWhyLanesWaitForAcks shows the franz-go behaviour that rules out sending an
// aggregate's next event before the previous one's ack (see Publisher.Publish):
// a record that fails does not always fail the record of the same key produced
// right behind it, which is then stored without its predecessor.
func TestWhyLanesWaitForAcks(t *testing.T) {
	t.Parallel()
	c := newCluster(t, false)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.addrs()...), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	first := &kgo.Record{Topic: "outbox.order", Key: []byte("a"), Value: make([]byte, 2<<20)} // refused by the client
	second := &kgo.Record{Topic: "outbox.order", Key: []byte("a"), Value: []byte("2")}
	results := cl.ProduceSync(t.Context(), first, second)
	if results[0].Err == nil {
		t.Fatal("a record larger than a batch was produced")
	}
	if results[1].Err != nil {
		t.Fatalf("the record behind a failed one failed too (%v): franz-go now fences a key after a failure, "+
			"so pipelining an aggregate's events may be reconsidered", results[1].Err)
	}
	if recs := read(t, c, "outbox.order"); len(recs) != 1 || string(recs[0].Value) != "2" {
		t.Fatalf("stored %d records, want only the second", len(recs))
	}
}

func TestRefusalsArePermanent(t *testing.T) {
	t.Parallel()
	c := newCluster(t, false)
	// A topic whose limit is below a record the client accepts, so the broker
	// refuses the batch.
	c.createTopic("outbox.small", 1, map[string]*string{"max.message.bytes": new("2048")})
	injected := func(topic string, err *kerr.Error) func() {
		return func() {
			c.kfake().Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: err, Count: -1})
		}
	}
	// Random text, so that compression cannot bring a batch under the limit.
	large := func(n int) func(*broker.Message) {
		return func(m *broker.Message) {
			raw := make([]byte, n*3/4)
			_, _ = rand.Read(raw)
			m.Payload = []byte(`"` + base64.StdEncoding.EncodeToString(raw) + `"`)
		}
	}
	cases := []struct {
		name    string
		aggType string
		setup   func()
		refuse  func(*broker.Message)
	}{
		{"record larger than a batch, refused by the client", "big", nil, large(2 << 20)},
		{"batch above the topic's max.message.bytes", "small", nil, large(4 << 10)},
		{"MESSAGE_TOO_LARGE", "toolarge", injected("outbox.toolarge", kerr.MessageTooLarge), nil},
		{"INVALID_RECORD", "invalid", injected("outbox.invalid", kerr.InvalidRecord), nil},
		{"TOPIC_AUTHORIZATION_FAILED", "secret", injected("outbox.secret", kerr.TopicAuthorizationFailed), nil},
		{"INVALID_TOPIC_EXCEPTION", "weird", injected("outbox.weird", kerr.InvalidTopicException), nil},
		{"topic name Kafka does not allow", "line item", nil, nil},
	}
	p := c.dial(kafka.Config{})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				tc.setup()
			}
			// The refused event heads its aggregate's lane; another aggregate of
			// the same type and one of another type are not affected.
			msgs := []broker.Message{
				message(tc.aggType, "a", 1), message(tc.aggType, "a", 2), message(tc.aggType, "a", 3),
				message("fine", tc.aggType, 1), message("fine", tc.aggType, 2),
			}
			if tc.refuse != nil {
				tc.refuse(&msgs[0])
			}
			results := publish(t, p, msgs...)
			if !broker.IsPermanent(results[0]) {
				t.Errorf("refused message: %v, want a permanent error", results[0])
			}
			for i := 1; i < 3; i++ {
				if !errors.Is(results[i], broker.ErrPredecessorFailed) {
					t.Errorf("seq %d after the refused one: %v, want ErrPredecessorFailed", i+1, results[i])
				}
			}
			for i := 3; i < 5; i++ {
				if results[i] != nil {
					t.Errorf("unrelated aggregate, seq %d: %v", i-2, results[i])
				}
			}
		})
	}
	// Nothing of a refused aggregate was stored, not even its later, valid events.
	for _, r := range read(t, c) {
		if header(r, wire.HeaderAggregateType) != "fine" {
			t.Errorf("stored %s seq %s in %s after its refusal", header(r, wire.HeaderAggregateType),
				header(r, wire.HeaderAggregateSequence), r.Topic)
		}
	}
}

func TestTransientErrorsAreUnavailable(t *testing.T) {
	t.Parallel()
	c := newCluster(t, false)
	fault := c.kfake().Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "outbox.flaky", Err: kerr.NotEnoughReplicas, Count: -1})
	p := c.dial(kafka.Config{ProduceTimeout: time.Second, DialOptions: fastRetries})

	msgs := []broker.Message{message("flaky", "a", 1), message("flaky", "a", 2)}
	results := publish(t, p, msgs...)
	if !broker.IsUnavailable(results[0]) || broker.IsPermanent(results[0]) {
		t.Errorf("NOT_ENOUGH_REPLICAS until the timeout: %v, want unavailable", results[0])
	}
	if !errors.Is(results[1], broker.ErrPredecessorFailed) {
		t.Errorf("next event of the aggregate: %v, want ErrPredecessorFailed", results[1])
	}

	// Once the replicas are back, a retry succeeds. The first retry may still
	// fail: the client fails the records buffered behind a batch that timed
	// out, and the first call's batch may time out only now.
	fault.Remove()
	wait.Forf(t, 30*time.Second, func() string { return fmt.Sprintf("a publish after the replicas came back (last: %v)", results) }, func() bool {
		results = publish(t, p, msgs...)
		if results[0] == nil && results[1] == nil {
			return true
		}
		if !broker.IsUnavailable(results[0]) {
			t.Fatalf("after the replicas came back: %v", results)
		}
		return false
	})
	// The records the first call gave up on may have been stored late: first
	// appearances must still be in order.
	var first []string
	seen := map[string]bool{}
	for _, r := range read(t, c, "outbox.flaky") {
		if s := header(r, wire.HeaderAggregateSequence); !seen[s] {
			seen[s] = true
			first = append(first, s)
		}
	}
	if strings.Join(first, ",") != "1,2" {
		t.Errorf("first appearances %v, want [1 2]", first)
	}
}

func TestMissingTopicIsUnavailable(t *testing.T) {
	t.Parallel()
	c := newBareCluster(t, false) // no automatic topic creation
	p := c.dial(kafka.Config{ProduceTimeout: 10 * time.Second, DialOptions: fastRetries})

	start := time.Now()
	results := publish(t, p, message("order", "a", 1), message("order", "a", 2))
	if !broker.IsUnavailable(results[0]) || broker.IsPermanent(results[0]) {
		t.Errorf("missing topic: %v, want unavailable (the topic may be created later)", results[0])
	}
	if !errors.Is(results[1], broker.ErrPredecessorFailed) {
		t.Errorf("next event of the aggregate: %v, want ErrPredecessorFailed", results[1])
	}
	t.Logf("missing topic reported after %s", time.Since(start).Round(time.Millisecond))

	c.createTopic("outbox.order", 2, nil)
	for i, err := range publish(t, p, message("order", "a", 1), message("order", "a", 2)) {
		if err != nil {
			t.Errorf("after the topic was created: result %d: %v", i, err)
		}
	}
}

func TestDialUnreachableIsUnavailable(t *testing.T) {
	t.Parallel()
	start := time.Now()
	p, err := kafka.Dial(t.Context(), "kafka://127.0.0.1:1", &kafka.Config{Logger: quiet, ProduceTimeout: time.Second})
	if err != nil {
		t.Fatalf("Dial: %v; an unreachable cluster must not be fatal", err)
	}
	defer p.Close()
	brokertest.CheckUnreachable(t, p, message("order", "a", 1), message("order", "a", 2), message("invoice", "b", 1))
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %s to report an unreachable cluster", d)
	}
}

func TestDialBeforeClusterStarts(t *testing.T) {
	t.Parallel()
	port := brokertest.FreePort(t)

	p, err := kafka.Dial(t.Context(), "kafka://127.0.0.1:"+strconv.Itoa(port), &kafka.Config{
		Logger: quiet, ProduceTimeout: time.Second, DialOptions: fastRetries,
	})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer p.Close()
	if err := publish(t, p, message("order", "a", 1))[0]; !broker.IsUnavailable(err) {
		t.Fatalf("before the cluster starts: %v, want unavailable", err)
	}

	kc, err := kfake.NewCluster(kfake.Ports(port), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatalf("start the cluster: %v", err)
	}
	defer kc.Close()
	var last error
	wait.Forf(t, 30*time.Second, func() string { return fmt.Sprintf("a publish after the cluster started (last: %v)", last) }, func() bool {
		last = publish(t, p, message("order", "a", 1))[0]
		if last != nil && !broker.IsUnavailable(last) {
			t.Fatalf("after the cluster started: %v", last)
		}
		return last == nil
	})
	if err := p.Ping(t.Context()); err != nil {
		t.Errorf("Ping: %v", err)
	}
}

func TestDialMalformedURL(t *testing.T) {
	t.Parallel()
	const password = "hunter2-Secret"
	for _, url := range []string{
		"",
		"http://127.0.0.1:9092",
		"kafka://",
		"kafka://127.0.0.1:notaport",
		"kafka://127.0.0.1:99999",
		"kafka://[::1",
		"kafka://::1:9092",
		"kafka://a:9092,,b:9092",
		"kafka://a:9092/path",
		"kafka://a:9092?tls=maybe",
		"kafka://a:9092?compression=zstd",
		"kafka://a:9092?sasl=gssapi",
		"kafka://relay:" + password + "@a:9092",
		"kafka://relay:" + password + "@a:9092?sasl=oauthbearer",
		"kafka://relay:" + password + "@a b:9092?sasl=plain",
		"kafka://relay:" + password + "%zz@a:9092?sasl=plain",
		"kafka://:" + password + "@a:9092?sasl=plain",
		"relay:" + password + "://a:9092",
		"kafka://a:9092?sasl=plain",
	} {
		p, err := kafka.Dial(t.Context(), url, &kafka.Config{Logger: quiet})
		if err == nil {
			p.Close()
			t.Errorf("Dial(%q): no error", url)
			continue
		}
		if msg := err.Error(); !strings.HasPrefix(msg, "kafka: ") || strings.Contains(msg, "\n") {
			t.Errorf("Dial(%q): error %q is not one line starting with \"kafka: \"", url, msg)
		}
		if strings.Contains(err.Error(), password) {
			t.Errorf("Dial(%q): error %q shows the password", url, err)
		}
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	for field, cfg := range map[string]kafka.Config{
		"Config.Topic":          {Topic: broker.MustParseTemplate("outbox/{aggregate_type}")},
		"Config.ProduceTimeout": {ProduceTimeout: -time.Second},
		"Config.SASL.Mechanism": {SASL: kafka.SASL{Mechanism: "GSSAPI", User: "relay"}},
		"Config.SASL.User":      {SASL: kafka.SASL{Mechanism: "scram-sha-512"}},
		"Config.SASL":           {SASL: kafka.SASL{User: "relay", Password: "x"}},
	} {
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: Validate: %v does not name the field", field, err)
		}
		cfg.Logger = quiet
		p, err := kafka.Dial(t.Context(), "kafka://127.0.0.1:1", &cfg)
		if err == nil {
			p.Close()
			t.Errorf("%s: no error", field)
		} else if !strings.Contains(err.Error(), field) {
			t.Errorf("%s: error %v does not name the field", field, err)
		}
	}
	_, err := kafka.Dial(t.Context(), "kafka://relay:x@127.0.0.1:1?sasl=plain", &kafka.Config{
		Logger: quiet, SASL: kafka.SASL{Mechanism: kafka.SASLPlain, User: "other", Password: "y"},
	})
	if err == nil || !strings.Contains(err.Error(), "Config.SASL") {
		t.Errorf("credentials in both the URL and Config.SASL: %v", err)
	}
	var nilCfg *kafka.Config
	if err := nilCfg.Validate(); err != nil {
		t.Errorf("nil Config: %v", err)
	}
	if err := (&kafka.Config{}).Validate(); err != nil {
		t.Errorf("zero Config: %v", err)
	}
	err = (&kafka.Config{ProduceTimeout: -1, SASL: kafka.SASL{Mechanism: "GSSAPI"}}).Validate()
	if err == nil || !strings.Contains(err.Error(), "Config.ProduceTimeout") || !strings.Contains(err.Error(), "Config.SASL") {
		t.Errorf("two invalid fields: %v, want both named", err)
	}
}

func TestNewRefusesUnsafeClients(t *testing.T) {
	t.Parallel()
	c := newCluster(t, false)
	client := func(opts ...kgo.Opt) *kgo.Client {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.addrs()...)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	for name, cl := range map[string]*kgo.Client{
		"DisableIdempotentWrite":             client(kgo.DisableIdempotentWrite()),
		"RequiredAcks":                       client(kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.LeaderAck())),
		"AllowIdempotentProduceCancellation": client(kgo.AllowIdempotentProduceCancellation()),
		"ManualFlushing":                     client(kgo.ManualFlushing()),
		"TransactionalID":                    client(kgo.TransactionalID("relay")),
	} {
		if _, err := kafka.New(cl, &kafka.Config{Logger: quiet}); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("client with %s: %v, want an error naming it", name, err)
		}
	}
	if _, err := kafka.Dial(t.Context(), c.url(), &kafka.Config{Logger: quiet, DialOptions: []kgo.Opt{kgo.DisableIdempotentWrite()}}); err == nil || !strings.Contains(err.Error(), "Config.DialOptions") {
		t.Errorf("Dial with kgo.DisableIdempotentWrite in Config.DialOptions: %v, want an error naming the field", err)
	}

	// A client with franz-go's defaults is fine, and stays the caller's.
	cl := client(kgo.ProducerLinger(0), kgo.AllowAutoTopicCreation())
	p, err := kafka.New(cl, &kafka.Config{Logger: quiet})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := publish(t, p, message("order", "a", 1))[0]; err != nil {
		t.Errorf("Publish: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := cl.Ping(t.Context()); err != nil {
		t.Errorf("the caller's client after Close: %v", err)
	}
}

func TestClosedPublisherFails(t *testing.T) {
	t.Parallel()
	c := newCluster(t, false)
	p := c.dial(kafka.Config{})
	if err := p.Ping(t.Context()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	for i, err := range publish(t, p, message("order", "a", 1), message("order", "b", 1)) {
		if !broker.IsUnavailable(err) {
			t.Errorf("Publish after Close: result %d: %v, want unavailable", i, err)
		}
	}
	if err := p.Ping(t.Context()); !broker.IsUnavailable(err) {
		t.Errorf("Ping after Close: %v, want unavailable", err)
	}
}

func TestPingReportsAStoppedCluster(t *testing.T) {
	t.Parallel()
	c := newCluster(t, false)
	p := c.dial(kafka.Config{})
	if err := p.Ping(t.Context()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	c.stop()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := p.Ping(ctx); !broker.IsUnavailable(err) {
		t.Errorf("Ping of a stopped cluster: %v, want unavailable", err)
	}
}

func TestTLSAndSASL(t *testing.T) {
	t.Parallel()
	serverTLS, roots := selfSigned(t)
	c := newCluster(t, false,
		kfake.TLS(serverTLS),
		kfake.EnableSASL(),
		kfake.Superuser(kafka.SASLPlain, "plain-user", "plain/pass@1"),
		kfake.Superuser(kafka.SASLScramSHA256, "scram256-user", "pass:256"),
		kfake.Superuser(kafka.SASLScramSHA512, "scram512-user", "pass 512"),
	)
	hosts := strings.Join(c.addrs(), ",")
	clientTLS := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	cases := []struct {
		name string
		url  string
		cfg  kafka.Config
		ok   bool
	}{
		{"PLAIN in the URL", "kafka://plain-user:plain%2Fpass%401@" + hosts + "?tls=true&sasl=plain", kafka.Config{}, true},
		{"SCRAM-SHA-256 in the URL", "kafka://scram256-user:pass%3A256@" + hosts + "?sasl=SCRAM-SHA-256", kafka.Config{}, true},
		{"SCRAM-SHA-512 in Config.SASL", "kafka://" + hosts, kafka.Config{
			SASL: kafka.SASL{Mechanism: kafka.SASLScramSHA512, User: "scram512-user", Password: "pass 512"},
		}, true},
		{"wrong password", "kafka://scram512-user:nope@" + hosts + "?sasl=scram-sha-512", kafka.Config{}, false},
		{"no credentials", "kafka://" + hosts, kafka.Config{}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := tc.cfg
			cfg.Logger, cfg.TLS, cfg.ProduceTimeout = quiet, clientTLS, 5*time.Second
			p, err := kafka.Dial(t.Context(), tc.url, &cfg)
			if err != nil {
				t.Fatalf("Dial: %v", err)
			}
			defer p.Close()
			err = publish(t, p, message("order", tc.name, 1))[0]
			switch {
			case tc.ok && err != nil:
				t.Errorf("Publish: %v", err)
			case !tc.ok && (!broker.IsUnavailable(err) || broker.IsPermanent(err)):
				t.Errorf("Publish: %v, want unavailable: refused credentials are not the event's fault", err)
			case !tc.ok:
				t.Logf("Publish: %v", err)
			}
		})
	}
}

// selfSigned returns a server TLS configuration for 127.0.0.1 and a pool that
// trusts it.
func selfSigned(t *testing.T) (*tls.Config, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kfake"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12}, pool
}

// Distinct (aggregate type, event type) pairs never share a topic: the pair
// whose value would need changing is refused, permanently, with the reason.
func TestAmbiguousTopicsRefused(t *testing.T) {
	t.Parallel()
	c := newCluster(t, false)
	p := c.dial(kafka.Config{Topic: broker.MustParseTemplate("outbox.{aggregate_type}.{event_type}")})
	for i, pair := range []struct {
		aggType, eventType string
		ok                 bool
	}{
		{"a.b", "c", false}, {"a", "b.c", true}, {"x.y.z", "w", false}, {"x", "y.z.w", true},
		{"", "c", false}, {"a", "", false}, {"a_b", "c", true}, {"a-b", "c", true},
	} {
		m := message(pair.aggType, fmt.Sprintf("agg-%d", i), 1)
		m.EventType = pair.eventType
		err := publish(t, p, m)[0]
		if pair.ok != (err == nil) || (err != nil && (!broker.IsPermanent(err) || !errors.Is(err, broker.ErrAmbiguousDestination))) {
			t.Errorf("%q/%q: %v, want ok=%v or a permanent ErrAmbiguousDestination", pair.aggType, pair.eventType, err, pair.ok)
		}
	}
}
