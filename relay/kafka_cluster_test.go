package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/kafka"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
)

// kafkaClusterPartitions is the partition count of the clustered test's topic.
const kafkaClusterPartitions = 6

// A 3-broker Kafka cluster (kfake) changes partition leaders while the relay
// drains a backlog: every leader moves to another broker, then an election
// picks every leader again, then the in-sync replicas fall below
// min.insync.replicas for a few produce requests, one of them after the append
// (stored, but the producer told it failed), then a broker leaves the cluster
// and its partitions move to the two others. The producer is idempotent with
// acks=all (broker/kafka's defaults, enforced by kafka.New): it follows the
// leaders, retries within its delivery timeout, and its sequence numbers let
// the broker drop the retry of a stored batch. Nothing is lost, each aggregate
// stays in one partition with first appearances in order.
func TestKafkaClusterLeadersMoveDuringDrain(t *testing.T) {
	t.Parallel()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(kafkaClusterPartitions))
	pgtest.Must(t, err, "kfake")
	t.Cleanup(cluster.Close)
	url := "kafka://" + strings.Join(cluster.ListenAddrs(), ",")
	const topic = "outbox.acct"

	o := newOutbox(t, 8)
	ids := o.enqueue(t, 30, 100) // 3,000 events
	pub, err := kafka.Dial(context.Background(), url, &kafka.Config{Logger: quietLogger()})
	pgtest.Must(t, err, "dial")
	t.Cleanup(func() { _ = pub.Close() })
	r := startRelay(t, o, pub, relay.Config{ID: "kafka-cluster", BatchSize: 100})

	steps := []struct {
		what string
		do   func()
	}{
		{"every partition's leader moved to the next broker", func() {
			for p := range int32(kafkaClusterPartitions) {
				pgtest.Must(t, cluster.MoveTopicPartition(topic, p, (cluster.LeaderFor(topic, p)+1)%3), "move a partition")
			}
		}},
		{"an election: every partition's leader picked again", cluster.ShufflePartitionLeaders},
		{"the in-sync replicas below min.insync.replicas, once after the append", func() {
			cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.NotEnoughReplicasAfterAppend, Count: 2})
			cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.NotEnoughReplicas, Count: 3})
		}},
		{"a broker lost: its partitions moved to the others", func() {
			pgtest.Must(t, cluster.RemoveNode(cluster.LeaderFor(topic, 0)), "remove a broker")
		}},
	}
	published := func() int { return o.count(t, "published_at IS NOT NULL") }
	for i, step := range steps {
		wait.For(t, 3*time.Minute, "publishing before the change", func() bool { return published() >= (i+1)*len(ids)/(len(steps)+1) })
		before, failed := published(), r.Stats().Failed
		changed := time.Now()
		step.do()
		wait.For(t, 3*time.Minute, "publishing after the change", func() bool { return published() > before+50 })
		t.Logf("%s: 50 more events published %s later (%d failed attempts)", step.what,
			time.Since(changed).Round(time.Millisecond), r.Stats().Failed-failed)
	}
	wait.For(t, 3*time.Minute, "the backlog to drain", func() bool { return o.count(t, "published_at IS NULL") == 0 })
	if n := o.count(t, "quarantined_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d events quarantined: %s", n, o.quarantineReason(t))
	}
	got, partitionOf := readKafka(t, cluster.ListenAddrs(), topic)
	dups := brokertest.CheckStream(t, got, ids)
	t.Logf("%d events in %d records over %d aggregates, %d duplicates; relay %+v", len(ids), len(got), len(partitionOf), dups, r.Stats())
}
