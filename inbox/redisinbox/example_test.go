package redisinbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log"
	"log/slog"

	"github.com/redis/go-redis/v9"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/redisstream"
	"github.com/pgoutbox/pgoutbox/inbox/internal/exampletest"
	"github.com/pgoutbox/pgoutbox/inbox/redisinbox"
)

// A consumer service: events the relay appended to a Redis stream (here a
// publisher stands in for it, on the local server) are applied to PostgreSQL
// once each, and acknowledged (XACK) after the commit.
func Example() {
	ctx := context.Background()
	var r [4]byte
	_, _ = rand.Read(r[:])
	stream := "example-inbox-" + hex.EncodeToString(r[:]) // a stream of the example's own
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	defer rdb.Del(ctx, stream, redisstream.DefaultDedupKeyPrefix+stream)

	// The event, appended twice: the second time under another dedup id, as a
	// relay's re-publish after the dedup window would be.
	pub, err := redisstream.Dial(ctx, "redis://127.0.0.1:6379", &redisstream.Config{
		Stream: broker.MustParseTemplate(stream), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	paid := exampletest.Paid()
	exampletest.Publish(ctx, pub, paid, exampletest.Republished(paid))

	// The consumer service: a Consumer "shipping" that records each paid order
	// once; its group "shipping" is shared by every instance.
	shop := exampletest.NewShop(ctx, 2, nil)
	defer shop.Close()
	sub, err := redisinbox.New(rdb, shop.Consumer, &redisinbox.Config{Stream: stream})
	if err != nil {
		log.Fatal(err)
	}
	if err := sub.Start(ctx); err != nil {
		log.Fatal(err)
	}
	// Finish waits for the two deliveries, then stops sub: Stop lets the
	// deliveries in progress commit and XACK.
	shop.Finish(ctx, sub, func() int64 { return sub.Stats().Acked })
	// Output:
	// applied
	// duplicate
	// acked 2; applied 1, duplicates 1; paid orders: 1
}
