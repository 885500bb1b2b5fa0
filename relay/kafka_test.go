package relay_test

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/kafka"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Two relays publish to a Kafka cluster (kfake, the real protocol in process) with
// 8 partitions per topic: every event arrives, each aggregate in one partition and
// in sequence order.
func TestRelaysToKafka(t *testing.T) {
	t.Parallel()
	cluster, err := kfake.NewCluster(kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(8))
	pgtest.Must(t, err, "kfake")
	t.Cleanup(cluster.Close)
	url := "kafka://" + strings.Join(cluster.ListenAddrs(), ",")

	o := newOutbox(t, 8)
	ids := o.enqueue(t, 50, 40)
	for range 2 {
		pub, err := kafka.Dial(context.Background(), url, &kafka.Config{Logger: quietLogger(), ProduceTimeout: 10 * time.Second})
		pgtest.Must(t, err, "dial")
		t.Cleanup(func() { _ = pub.Close() })
		startRelay(t, o, pub, relay.Config{BatchSize: 200})
	}
	wait.For(t, time.Minute, "the backlog to drain", func() bool { return o.count(t, "published_at IS NULL") == 0 })

	got, partitionOf := readKafka(t, cluster.ListenAddrs(), "outbox.acct")
	dups := brokertest.CheckStream(t, got, ids)
	t.Logf("%d events in %d records over %d aggregates, %d duplicates", len(ids), len(got), len(partitionOf), dups)
}

// readKafka reads every record of topic back from the cluster at addrs (as
// many as the partitions' end offsets say), partition by partition in offset
// order, decoded from the wire headers. It
// checks that each record's key is its aggregate id and that an aggregate's
// records are all in one partition, which it returns per aggregate id.
func readKafka(t *testing.T, addrs []string, topic string) ([]broker.Message, map[string]int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admCl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	pgtest.Must(t, err, "admin client")
	defer admCl.Close()
	ends, err := kadm.NewClient(admCl).ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	pgtest.Must(t, err, "list end offsets")
	n := 0
	ends.Each(func(o kadm.ListedOffset) { n += int(o.Offset) })
	cons, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	pgtest.Must(t, err, "consumer")
	defer cons.Close()
	var records []*kgo.Record
	for len(records) < n {
		fetches := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records: %v", len(records), n, ctx.Err())
		}
		fetches.EachRecord(func(r *kgo.Record) { records = append(records, r) })
	}
	slices.SortFunc(records, func(a, b *kgo.Record) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	partitionOf := map[string]int32{}
	var got []broker.Message
	for _, r := range records {
		names := make([]string, len(r.Headers))
		for i, h := range r.Headers {
			names[i] = h.Key
		}
		m, err := wire.ParseOutboxHeaders(r.Value, names, func(n string) string {
			for _, h := range r.Headers {
				if h.Key == n {
					return string(h.Value)
				}
			}
			return ""
		})
		pgtest.Must(t, err, "decode record")
		if string(r.Key) != m.AggregateID {
			t.Fatalf("record key %q, aggregate %s", r.Key, m.AggregateID)
		}
		if p, ok := partitionOf[m.AggregateID]; ok && p != r.Partition {
			t.Fatalf("aggregate %s in partitions %d and %d", m.AggregateID, p, r.Partition)
		}
		partitionOf[m.AggregateID] = r.Partition
		got = append(got, m)
	}
	return got, partitionOf
}
