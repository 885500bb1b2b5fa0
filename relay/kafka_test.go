package relay_test

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/kafka"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
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

	// Read every record back, partition by partition in offset order.
	cons, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("outbox.acct"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	pgtest.Must(t, err, "consumer")
	defer cons.Close()
	var records []*kgo.Record
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for len(records) < len(ids) {
		fetches := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records: %v", len(records), len(ids), ctx.Err())
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
		m, err := broker.ParseWireHeaders(r.Value, names, func(n string) string {
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
	dups := brokertest.CheckStream(t, got, ids)
	t.Logf("%d events in %d records over %d aggregates, %d duplicates", len(ids), len(records), len(partitionOf), dups)
}
