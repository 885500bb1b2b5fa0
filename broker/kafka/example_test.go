package kafka_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/kafka"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Publish two events of one aggregate to Kafka and read them back from their
// partition. The cluster here is franz-go's in-process kfake; point Dial at
// kafka://your-brokers:9092 instead (with ?tls=true&sasl=scram-sha-512 and
// credentials for a managed cluster).
func Example() {
	ctx := context.Background()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	url := "kafka://" + strings.Join(cluster.ListenAddrs(), ",")

	pub, err := kafka.Dial(ctx, url, &kafka.Config{
		Logger: slog.New(slog.DiscardHandler), // the default is slog.Default()
	})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	var msgs []broker.Message
	for seq, typ := range []string{"created", "paid"} {
		msgs = append(msgs, broker.Message{
			EventID:           pgoutbox.NewEventID(),
			AggregateType:     "order",
			AggregateID:       "42",
			AggregateSequence: int64(seq + 1),
			EventType:         typ,
			SchemaVersion:     1,
			OccurredAt:        time.Now(),
			Payload:           []byte(fmt.Sprintf(`{"status":%q}`, typ)),
		})
	}
	fmt.Println("results:", pub.Publish(ctx, msgs))

	consumer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...),
		kgo.ConsumeTopics("outbox.order"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		log.Fatal(err)
	}
	defer consumer.Close()
	for read := 0; read < len(msgs); {
		consumer.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			read++
			var typ string
			for _, h := range r.Headers {
				if h.Key == wire.HeaderEventType {
					typ = string(h.Value)
				}
			}
			fmt.Printf("%s key=%s %s %s\n", r.Topic, r.Key, typ, r.Value)
		})
	}
	// Output:
	// results: [<nil> <nil>]
	// outbox.order key=42 created {"status":"created"}
	// outbox.order key=42 paid {"status":"paid"}
}
