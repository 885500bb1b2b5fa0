package kafkainbox_test

import (
	"context"
	"log"
	"log/slog"
	"strings"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgoutbox/pgoutbox/broker/kafka"
	"github.com/pgoutbox/pgoutbox/inbox/internal/exampletest"
	"github.com/pgoutbox/pgoutbox/inbox/kafkainbox"
)

// A consumer service: events the relay published to the topic outbox.order (here
// a publisher stands in for it, on franz-go's in-process kfake cluster) are applied
// to PostgreSQL once each, and their offsets committed after the commit.
func Example() {
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler) // the default is slog.Default()

	// The broker, with one event on it, published twice (a relay re-publish).
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "outbox.order"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	pub, err := kafka.Dial(ctx, "kafka://"+strings.Join(cluster.ListenAddrs(), ","), &kafka.Config{Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	paid := exampletest.Paid()
	exampletest.Publish(ctx, pub, paid, paid)

	// The consumer service: a Consumer "shipping" that records each paid order
	// once (built as in the inbox package's example).
	shop := exampletest.NewShop(ctx, 2, quiet)
	defer shop.Close()

	// Group "shipping" (the consumer's name), shared by every instance.
	sub, err := kafkainbox.Dial(cluster.ListenAddrs(), "", []string{"outbox.order"}, shop.Consumer,
		&kafkainbox.Config{Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	if err := sub.Start(ctx); err != nil {
		log.Fatal(err)
	}
	// Finish waits for the two deliveries, then stops sub: Stop lets the
	// records in progress commit, commits their offsets and leaves the group.
	shop.Finish(ctx, sub, func() int64 { return sub.Stats().Acked })
	// Output:
	// applied
	// duplicate
	// acked 2; applied 1, duplicates 1; paid orders: 1
}
