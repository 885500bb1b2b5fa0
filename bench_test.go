package pgoutbox_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// BenchmarkBusinessTx measures what the outbox adds to a small business transaction
// (one INSERT, commit): the same transaction without and with one enqueued event,
// serially and from 16 concurrent producers, and with the relays' wake-up
// notification turned off (SET pgoutbox.notify = 'off'). Compare the two ns/op of one run:
//
//	go test -run '^$' -bench BusinessTx -count 6 . | benchstat -col /outbox -
func BenchmarkBusinessTx(b *testing.B) {
	for _, producers := range []int{1, 16} {
		for _, outbox := range []string{"without", "with", "with-notify-off"} {
			b.Run(fmt.Sprintf("producers=%d/outbox=%s", producers, outbox), func(b *testing.B) {
				benchBusinessTx(b, producers, outbox != "without", outbox == "with-notify-off")
			})
		}
	}
}

func benchBusinessTx(b *testing.B, producers int, withOutbox, notifyOff bool) {
	f := newFixture(b, int32(producers))
	ctx := context.Background()
	if notifyOff {
		cfg := f.pool.Config().Copy()
		cfg.ConnConfig.RuntimeParams["pgoutbox.notify"] = "off"
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		pgtest.Must(b, err, "pool with notify off")
		b.Cleanup(pool.Close)
		f.pool = pool
	}
	orders := f.table("orders")
	_, err := f.pool.Exec(ctx, "CREATE TABLE "+orders+" (id bigint PRIMARY KEY, customer text NOT NULL, total_cents int NOT NULL)")
	pgtest.Must(b, err, "create orders")
	payload := map[string]any{"customer": "c-42", "total_cents": 1999, "lines": []string{"sku-1", "sku-2"}}

	var next atomic.Int64
	tx1 := func() error {
		id := next.Add(1)
		return pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO "+orders+" VALUES ($1, 'c-42', 1999)", id); err != nil {
				return err
			}
			if withOutbox {
				_, err := f.p.EnqueueTx(ctx, tx, pgoutbox.Event{
					AggregateType: "order", AggregateID: fmt.Sprint(id), EventType: "order.placed", Payload: payload})
				return err
			}
			return nil
		})
	}
	// Warm the pool's connections and statement caches before timing.
	for range producers {
		pgtest.Must(b, tx1(), "warm-up")
	}
	b.ResetTimer()
	if producers == 1 {
		for b.Loop() {
			if err := tx1(); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	b.SetParallelism((producers + 1) / 2) // GOMAXPROCS is 2 here: 16 goroutines
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := tx1(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
