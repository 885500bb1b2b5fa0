package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/internal/exampletest"
)

// balances is the examples' table: an account's balance.
const balances = "balances (account text PRIMARY KEY, cents bigint NOT NULL)"

// deposited is what the relay would publish: an event of aggregate account/<id>.
func deposited(account string, seq int64, cents int) broker.Message {
	return broker.Message{
		EventID: pgoutbox.NewEventID(), AggregateType: "account", AggregateID: account, AggregateSequence: seq,
		EventType: "account.deposited", SchemaVersion: 1, OccurredAt: time.Now(),
		Payload: fmt.Appendf(nil, `{"account":%q,"cents":%d}`, account, cents),
	}
}

// A delivery processed three times (the broker redelivered it) changes the balance
// once: the processed_events row and the balance update commit together.
func Example() {
	ctx := context.Background()
	pool, schema, done := exampletest.DB(ctx, balances)
	defer done()

	type Deposited struct {
		Account string `json:"account"`
		Cents   int64  `json:"cents"`
	}
	credit := func(ctx context.Context, tx pgx.Tx, ev inbox.Event, d Deposited) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+schema+".balances AS b VALUES ($1, $2) "+
			"ON CONFLICT (account) DO UPDATE SET cents = b.cents + excluded.cents", d.Account, d.Cents)
		return err
	}
	consumer, err := inbox.New(inbox.Pgx(pool), inbox.HandleJSON(credit), &inbox.Config{Name: "ledger", Schema: schema})
	if err != nil {
		log.Fatal(err)
	}

	msg := deposited("acc-1", 1, 1250)
	for range 3 {
		// A subscriber (package inbox/natsinbox, say) does this for every message,
		// then acks, nacks or terminates it as the outcome says.
		o := consumer.Process(ctx, inbox.DeliveryOf(msg))
		fmt.Println(o.Status, "→", o.Action())
	}
	var cents int64
	if err := pool.QueryRow(ctx, "SELECT cents FROM "+schema+".balances WHERE account = 'acc-1'").Scan(&cents); err != nil {
		log.Fatal(err)
	}
	fmt.Println("balance", cents)
	// Output:
	// applied → ack
	// duplicate → ack
	// duplicate → ack
	// balance 1250
}

// Under GapReject (the default) an event that overtook its predecessor is refused
// and nacked; redelivered after the predecessor, it applies in order.
func ExampleGapReject() {
	ctx := context.Background()
	pool, schema, done := exampletest.DB(ctx, balances)
	defer done()

	consumer, err := inbox.New(inbox.Pgx(pool), func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
		fmt.Println("handler: sequence", ev.AggregateSequence)
		return nil
	}, &inbox.Config{Name: "ledger", Schema: schema, GapPolicy: inbox.GapReject})
	if err != nil {
		log.Fatal(err)
	}
	first, second := deposited("acc-1", 1, 100), deposited("acc-1", 2, 200)
	for _, m := range []broker.Message{second, first, second} {
		o := consumer.Process(ctx, inbox.DeliveryOf(m))
		fmt.Println("sequence", m.AggregateSequence, o.Status, "→", o.Action(), errors.Is(o.Err, inbox.ErrGap))
	}
	// Output:
	// sequence 2 gap-rejected → nak true
	// handler: sequence 1
	// sequence 1 applied → ack false
	// handler: sequence 2
	// sequence 2 applied → ack false
}

// An operator skipped sequence 2 upstream ("pgoutbox dlq skip"): it will never be
// delivered. Moving the consumer's position past it lets sequence 3 through.
func ExampleConsumer_SetPosition() {
	ctx := context.Background()
	pool, schema, done := exampletest.DB(ctx, balances)
	defer done()

	consumer, err := inbox.New(inbox.Pgx(pool), func(context.Context, pgx.Tx, inbox.Event) error { return nil },
		&inbox.Config{Name: "ledger", Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(consumer.Process(ctx, inbox.DeliveryOf(deposited("acc-1", 1, 100))).Status)
	third := deposited("acc-1", 3, 300)
	fmt.Println(consumer.Process(ctx, inbox.DeliveryOf(third)).Status)

	if err := consumer.SetPosition(ctx, "account", "acc-1", 2); err != nil {
		log.Fatal(err)
	}
	fmt.Println(consumer.Process(ctx, inbox.DeliveryOf(third)).Status)
	pos, err := consumer.Position(ctx, "account", "acc-1")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("position", pos)
	// Output:
	// applied
	// gap-rejected
	// applied
	// position 3
}

// Each schema change of a payload adds one step; handlers only know the newest
// shape.
func ExampleUpcasters() {
	type v1 struct {
		Name string `json:"name"` // "Ada Lovelace"
	}
	type v2 struct {
		First string `json:"first"`
		Last  string `json:"last"`
	}
	var up inbox.Upcasters
	up.Register("customer.created", 1, inbox.UpcastJSON(func(in v1) (v2, error) {
		var out v2
		_, err := fmt.Sscan(in.Name, &out.First, &out.Last)
		return out, err
	})).Register("customer.created", 2, func(p []byte) ([]byte, error) {
		return p, nil // v3 only added an optional field
	})

	version, payload, err := up.Upcast("customer.created", 1, []byte(`{"name":"Ada Lovelace"}`))
	fmt.Println(version, string(payload), err)
	version, payload, err = up.Upcast("order.paid", 4, []byte(`{}`)) // unknown type: unchanged
	fmt.Println(version, string(payload), err)
	// In a consumer: inbox.Config{Upcaster: up.Upcast}.
	// Output:
	// 3 {"first":"Ada","last":"Lovelace"} <nil>
	// 4 {} <nil>
}

// A handler that calls a remote service passes the event id as the idempotency key:
// the call is outside the transaction, so a crash after it and before the commit
// repeats it, and only the remote side can drop the repeat.
func ExampleIdempotencyKey() {
	id, _ := pgoutbox.ParseUUID("0190a6e4-7f1c-7b2a-9c3d-1e2f3a4b5c6d")
	handler := func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
		key := inbox.IdempotencyKey(ev)
		fmt.Println("POST /charges  Idempotency-Key:", key)
		fmt.Println("POST /receipts Idempotency-Key:", key+"/receipt") // one key per distinct call
		return nil
	}
	_ = handler(context.Background(), nil, inbox.Event{EventID: id})
	// Output:
	// POST /charges  Idempotency-Key: 0190a6e4-7f1c-7b2a-9c3d-1e2f3a4b5c6d
	// POST /receipts Idempotency-Key: 0190a6e4-7f1c-7b2a-9c3d-1e2f3a4b5c6d/receipt
}

// Retention keeps dedup rows at least as long as an event can be delivered again.
func ExampleCleanup() {
	ctx := context.Background()
	pool, schema, done := exampletest.DB(ctx, balances)
	defer done()
	// Three events applied 40 days ago, one today.
	if _, err := pool.Exec(ctx, "INSERT INTO "+schema+".processed_events (consumer_name, event_id, processed_at) "+
		"SELECT 'ledger', gen_random_uuid(), now() - interval '40 days' FROM generate_series(1, 3)"); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO "+schema+".processed_events (consumer_name, event_id) VALUES ('ledger', gen_random_uuid())"); err != nil {
		log.Fatal(err)
	}

	// Published outbox rows are kept 14 days and the stream keeps messages 7
	// days: an event can come back up to 21 days after it was applied.
	replay := 21 * 24 * time.Hour
	_, err := inbox.Cleanup(ctx, inbox.Pgx(pool), inbox.CleanupConfig{Schema: schema, Retention: 7 * 24 * time.Hour, ReplayHorizon: replay})
	fmt.Println(errors.Is(err, inbox.ErrRetentionTooShort))

	res, err := inbox.Cleanup(ctx, inbox.Pgx(pool), inbox.CleanupConfig{Schema: schema, Retention: 30 * 24 * time.Hour, ReplayHorizon: replay})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("deleted", res.Deleted, "in", res.Batches, "batch(es)")
	// Output:
	// true
	// deleted 3 in 1 batch(es)
}
