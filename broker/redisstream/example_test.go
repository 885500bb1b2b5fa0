package redisstream_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"

	"github.com/redis/go-redis/v9"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/redisstream"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Publish an event to the Redis server on localhost and read the entry back.
// The password, if the server wants one, comes from the environment.
func Example() {
	ctx := context.Background()
	pub, err := redisstream.Dial(ctx, "redis://127.0.0.1:6379", &redisstream.Config{
		Stream:   broker.MustParseTemplate("example.{aggregate_type}"),
		Password: os.Getenv("PGOUTBOX_REDIS_PASSWORD"),
		// The example's server persists nothing: keep its warning out of the output.
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	// An event as the relay reads it from the outbox: order 42, created.
	m := brokertest.Message("order", "42", 1)
	results := pub.Publish(ctx, []broker.Message{m})
	fmt.Println("result:", results[0])

	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", Password: os.Getenv("PGOUTBOX_REDIS_PASSWORD")})
	defer rdb.Close()
	defer rdb.Del(ctx, "example.order", redisstream.DefaultDedupKeyPrefix+"example.order")
	entries, err := rdb.XRange(ctx, "example.order", "-", "+").Result()
	if err != nil {
		log.Fatal(err)
	}
	last := entries[len(entries)-1].Values
	fmt.Println(last["body"], last[wire.HeaderAggregateType], last[wire.HeaderAggregateSequence])
	// Output:
	// result: <nil>
	// {"total":"9.50"} order 1
}
