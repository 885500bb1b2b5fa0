package kafkainbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/kafka"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/kafkainbox"
	"github.com/pgoutbox/pgoutbox/internal/inboxtest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.DiscardHandler)

// topic is where the publisher's default template puts events of aggregate type
// "order".
const topic = "outbox.order"

// env is one test's world: a migrated schema with a business table (effects: one row
// per application, numbered in application order), an in-process Kafka cluster of
// its own (kfake, which speaks the real protocol) with a multi-partition topic, and
// the relay's Kafka publisher on it.
type env struct {
	*inboxtest.Effects
	*kcluster
	pool   *pgxpool.Pool
	schema string
}

// kcluster is an in-process Kafka cluster with the topic, the relay's publisher
// and an admin client.
type kcluster struct {
	cluster *kfake.Cluster
	addrs   []string
	pub     *kafka.Publisher
	adm     *kadm.Client
}

func newEnv(t testing.TB, maxConns int32, partitions int32) *env {
	t.Helper()
	pool, schema := pgtest.Migrated(t, maxConns)
	e := &env{pool: pool, schema: schema, kcluster: newCluster(t, partitions)}
	e.Effects = inboxtest.NewEffects(t, pool, schema)
	return e
}

func newCluster(t testing.TB, partitions int32) *kcluster {
	t.Helper()
	e := &kcluster{}
	var err error

	// Short session timeouts are allowed so that a killed member leaves the group
	// quickly (TestCrashKillsProcessAfterCommit).
	e.cluster, err = kfake.NewCluster(kfake.SeedTopics(partitions, topic), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	pgtest.Must(t, err, "kfake")
	t.Cleanup(e.cluster.Close)
	e.addrs = e.cluster.ListenAddrs()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e.pub, err = kafka.Dial(ctx, "kafka://"+strings.Join(e.addrs, ","), &kafka.Config{Logger: quiet})
	pgtest.Must(t, err, "kafka.Dial")
	t.Cleanup(func() { _ = e.pub.Close() })
	admCl, err := kgo.NewClient(kgo.SeedBrokers(e.addrs...))
	pgtest.Must(t, err, "admin client")
	t.Cleanup(admCl.Close)
	e.adm = kadm.NewClient(admCl)
	return e
}

// applied returns the n (application rank) of each applied event, by event id.
func (e *env) applied(t testing.TB) map[string]int64 {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), "SELECT event_id::text, n FROM "+e.Table("effects"))
	pgtest.Must(t, err, "read effects")
	out := map[string]int64{}
	var id string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error {
		out[id] = n
		return nil
	})
	pgtest.Must(t, err, "read effects")
	return out
}

// clientOpts are the options of a group member on the env's topic. A short
// heartbeat interval makes members notice rebalances within 100ms rather than 3s.
func (e *kcluster) clientOpts(extra ...kgo.Opt) []kgo.Opt {
	return append([]kgo.Opt{
		kgo.SeedBrokers(e.addrs...),
		kgo.ConsumeTopics(topic),
		kgo.HeartbeatInterval(100 * time.Millisecond),
		kgo.FetchMaxWait(200 * time.Millisecond),
	}, extra...)
}

// newSubscriber returns a subscriber in the group named after proc, not started.
func (e *kcluster) newSubscriber(t testing.TB, proc inbox.Processor, cfg kafkainbox.Config, extra ...kgo.Opt) *kafkainbox.Subscriber {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	s, err := kafkainbox.New(e.clientOpts(extra...), proc, &cfg)
	pgtest.Must(t, err, "kafkainbox.New")
	return s
}

// subscribe starts a subscriber, stopped when the test ends.
func (e *kcluster) subscribe(t testing.TB, proc inbox.Processor, cfg kafkainbox.Config, extra ...kgo.Opt) *kafkainbox.Subscriber {
	t.Helper()
	s := e.newSubscriber(t, proc, cfg, extra...)
	pgtest.Must(t, s.Start(context.Background()), "Start")
	inboxtest.StopAtEnd(t, s)
	return s
}

// publish stores msgs with the relay's publisher: key = aggregate id, every wire
// header, each aggregate's events in order.
func (e *kcluster) publish(t testing.TB, msgs []broker.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, err := range e.pub.Publish(ctx, msgs) {
		if err != nil {
			t.Fatalf("publish %s/%d: %v", msgs[i].AggregateID, msgs[i].AggregateSequence, err)
		}
	}
}

// produceRaw stores a record as another producer would, without outbox headers.
func (e *kcluster) produceRaw(t testing.TB, key, value string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.addrs...))
	pgtest.Must(t, err, "producer")
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pgtest.Must(t, cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(value)}).FirstErr(), "produce")
}

// offsets returns the group's committed offset and the end offset of each
// partition of the topic (a partition without a commit counts as committed at 0).
func (e *kcluster) offsets(t testing.TB, group string) (committed, end map[int32]int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := e.adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	pgtest.Must(t, err, "list end offsets")
	fetched, err := e.adm.FetchOffsets(ctx, group)
	if err == nil {
		err = fetched.Error()
	}
	if errors.Is(err, kerr.GroupIDNotFound) {
		err = nil // no member has joined yet: nothing committed
	}
	pgtest.Must(t, err, "fetch committed offsets")
	committed, end = map[int32]int64{}, map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		end[o.Partition] = o.Offset
		committed[o.Partition] = 0
		if c, ok := fetched.Lookup(o.Topic, o.Partition); ok && c.At >= 0 {
			committed[o.Partition] = c.At
		}
	})
	return committed, end
}

// lag is how many records of the topic lie beyond the group's committed offsets.
func (e *kcluster) lag(t testing.TB, group string) int64 {
	t.Helper()
	committed, end := e.offsets(t, group)
	var lag int64
	for p, o := range end {
		lag += o - committed[p]
	}
	return lag
}

// records reads every record of the topic, each partition in offset order.
func (e *kcluster) records(t testing.TB) []*kgo.Record {
	t.Helper()
	_, end := e.offsets(t, "nobody")
	from := map[int32]kgo.Offset{}
	left := 0
	for p, o := range end {
		if o > 0 {
			from[p] = kgo.NewOffset().AtStart()
			left++
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.addrs...), kgo.FetchMaxWait(100*time.Millisecond),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}))
	pgtest.Must(t, err, "reader")
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []*kgo.Record
	for left > 0 {
		fs := cl.PollFetches(ctx)
		pgtest.Must(t, ctx.Err(), "read the topic")
		fs.EachRecord(func(r *kgo.Record) {
			out = append(out, r)
			if r.Offset == end[r.Partition]-1 {
				left--
			}
		})
	}
	return out
}

// partitionOf is the partition the publisher's key hashing (murmur2, as Kafka's
// Java client) puts aggregate id in.
func partitionOf(id string, partitions int) int32 {
	return int32(kgo.StickyKeyPartitioner(nil).ForTopic(topic).Partition(&kgo.Record{Key: []byte(id)}, partitions))
}

// idsIn returns n aggregate ids that hash to partition p.
func idsIn(p int32, partitions, n int) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		if id := fmt.Sprintf("agg-%d", i); partitionOf(id, partitions) == p {
			out = append(out, id)
		}
	}
	return out
}
