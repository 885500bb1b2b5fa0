package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	natsbroker "github.com/pgoutbox/pgoutbox/broker/nats"
	"github.com/pgoutbox/pgoutbox/migrate"
	"github.com/pgoutbox/pgoutbox/relay"
)

// demoDatabaseURL is used when neither --database-url nor DATABASE_URL is set: a
// local PostgreSQL with trust authentication, as on a developer machine.
const demoDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

func newDemoCmd() *cobra.Command {
	var db dbFlags
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Show the outbox at work on a local database, in a schema of its own",
		Long: `Run a short scripted demonstration against PostgreSQL: migrate a fresh schema
(pgoutbox_demo by default; it is dropped and recreated on every run and left in
place afterwards for you to inspect), then place orders in business transactions
that also enqueue events: a commit, a rollback, a multi-event transaction and an
enqueue through the outbox_enqueue SQL function. Then a relay publishes them to an
embedded NATS JetStream server, and the demo prints the stream as a consumer
sees it. It prints what each step proves.

Without --database-url or DATABASE_URL it uses ` + demoDatabaseURL + `.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			hint := ""
			if db.url == "" {
				db.url, hint = demoDatabaseURL, demoDatabaseURL
			}
			conn, err := db.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close(context.WithoutCancel(cmd.Context()))
			return runDemo(cmd.Context(), conn, db.schema, cmd.OutOrStdout(), hint)
		},
	}
	db.register(cmd.Flags())
	schema := cmd.Flags().Lookup("schema")
	schema.DefValue, schema.Usage = "pgoutbox_demo", "schema the demo drops, recreates and fills (env PGOUTBOX_DEMO_SCHEMA)"
	_ = schema.Value.Set("pgoutbox_demo")
	return cmd
}

type order struct {
	ID    string `json:"order_id"`
	Total int    `json:"total_cents"`
}

// runDemo runs the demonstration; psqlURL, when set, is shown for inspecting the result.
func runDemo(ctx context.Context, conn *pgx.Conn, schema string, out io.Writer, psqlURL string) error {
	q := pgx.Identifier{schema}.Sanitize()
	fmt.Fprintf(out, "pgoutbox demo: schema %s (dropped and recreated)\n\n", q)
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+q+" CASCADE"); err != nil {
		return fmt.Errorf("reset demo schema: %w", err)
	}
	applied, err := migrate.Up(ctx, conn, &migrate.Config{Schema: schema})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "1. migrate: applied %d migrations\n", len(applied))
	if _, err := conn.Exec(ctx, "CREATE TABLE "+q+".orders (id text PRIMARY KEY, total_cents int NOT NULL, status text NOT NULL)"); err != nil {
		return fmt.Errorf("create orders table: %w", err)
	}
	producer, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	if err != nil {
		return err
	}

	// placeOrder is the business transaction: the order row and its events commit or
	// roll back together.
	placeOrder := func(o order, paid, fail bool) error {
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO "+q+".orders VALUES ($1, $2, 'placed')", o.ID, o.Total); err != nil {
				return err
			}
			events := []pgoutbox.Event{{AggregateType: "order", AggregateID: o.ID, EventType: "order.placed", Payload: o}}
			if paid {
				events = append(events, pgoutbox.Event{AggregateType: "order", AggregateID: o.ID, EventType: "order.paid", Payload: o})
			}
			if _, err := producer.EnqueueTx(ctx, tx, events...); err != nil {
				return err
			}
			if fail {
				return errDemoRollback
			}
			return nil
		})
	}
	if err := placeOrder(order{"A-1", 1250}, false, false); err != nil {
		return err
	}
	fmt.Fprintln(out, "2. order A-1 placed: its row and one event committed together")
	if err := placeOrder(order{"B-2", 990}, false, true); !errors.Is(err, errDemoRollback) {
		return fmt.Errorf("rolled-back order: %v", err)
	}
	fmt.Fprintln(out, "3. order B-2 failed and rolled back: no row, no event")
	if err := placeOrder(order{"C-3", 4200}, true, false); err != nil {
		return err
	}
	fmt.Fprintln(out, "4. order C-3 placed and paid in one transaction: two events, consecutive sequences")
	if _, err := conn.Exec(ctx, "SELECT "+q+".outbox_enqueue('order', 'A-1', 'order.shipped', '{\"order_id\":\"A-1\",\"carrier\":\"post\"}')"); err != nil {
		return fmt.Errorf("outbox_enqueue: %w", err)
	}
	fmt.Fprintln(out, "5. order A-1 shipped, enqueued from SQL with outbox_enqueue(): next in A-1's lane")

	rows, err := conn.Query(ctx, "SELECT aggregate_id, aggregate_sequence, event_type, event_id::text, payload::text FROM "+q+
		".outbox_events ORDER BY aggregate_id, aggregate_sequence")
	if err != nil {
		return fmt.Errorf("read outbox: %w", err)
	}
	fmt.Fprintf(out, "\n%s.outbox_events (unpublished, waiting for the relay):\n", q)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "AGGREGATE\tSEQ\tEVENT TYPE\tEVENT ID\tPAYLOAD")
	n := 0
	for rows.Next() {
		var agg, typ, id, payload string
		var seq int64
		if err := rows.Scan(&agg, &seq, &typ, &id, &payload); err != nil {
			return fmt.Errorf("read outbox: %w", err)
		}
		fmt.Fprintf(w, "order/%s\t%d\t%s\t%s\t%s\n", agg, seq, typ, id, payload)
		n++
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read outbox: %w", err)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	var orders int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+q+".orders").Scan(&orders); err != nil {
		return fmt.Errorf("count orders: %w", err)
	}
	fmt.Fprintf(out, "\n%d orders, %d events: every committed change has its events, the rolled-back one has none.\n\n", orders, n)

	if err := demoRelay(ctx, conn.Config(), schema, n, out); err != nil {
		return err
	}
	if psqlURL != "" {
		fmt.Fprintf(out, "\nInspect with: psql '%s' -c 'TABLE %s.outbox_events'\n", psqlURL, q)
	}
	return nil
}

// demoRelay runs a relay against an embedded NATS JetStream server until the n
// events are published, then prints what the stream holds.
func demoRelay(ctx context.Context, connCfg *pgx.ConnConfig, schema string, n int, out io.Writer) error {
	dir, err := os.MkdirTemp("", "pgoutbox-demo-nats")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	srv, err := natsbroker.StartEmbedded(natsbroker.EmbeddedConfig{StoreDir: dir, Port: -1})
	if err != nil {
		return fmt.Errorf("start embedded NATS: %w", err)
	}
	defer srv.Shutdown()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	pub, err := natsbroker.Dial(ctx, srv.URL(), natsbroker.Config{Logger: quiet})
	if err != nil {
		return err
	}
	defer pub.Close()
	poolCfg, err := pgxpool.ParseConfig("")
	if err != nil {
		return err
	}
	poolCfg.ConnConfig = connCfg.Copy()
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return fmt.Errorf("connect to database: %w", err)
	}
	defer pool.Close()

	r, err := relay.New(pool, pub, &relay.Config{Schema: schema, ID: "demo-relay", Logger: quiet})
	if err != nil {
		return err
	}
	start := time.Now()
	if err := r.Start(ctx); err != nil {
		return err
	}
	defer r.Stop(context.WithoutCancel(ctx)) //nolint:errcheck // the demo's results are printed below
	events := pgx.Identifier{schema, "outbox_events"}.Sanitize()
	for {
		var pending int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+events+" WHERE published_at IS NULL").Scan(&pending); err != nil {
			return fmt.Errorf("count pending events: %w", err)
		}
		if pending == 0 {
			break
		}
		if time.Since(start) > 30*time.Second {
			return fmt.Errorf("the relay did not publish the %d pending events within 30s", pending)
		}
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Fprintf(out, "6. relay: published %d events to an embedded NATS JetStream server (%s) in %s\n",
		n, srv.URL(), time.Since(start).Round(time.Millisecond))

	nc, err := natsgo.Connect(srv.URL())
	if err != nil {
		return fmt.Errorf("connect to NATS: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cons, err := js.OrderedConsumer(ctx, "OUTBOX", jetstream.OrderedConsumerConfig{})
	if err != nil {
		return fmt.Errorf("read stream OUTBOX: %w", err)
	}
	batch, err := cons.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		return fmt.Errorf("read stream OUTBOX: %w", err)
	}
	fmt.Fprintf(out, "\nstream OUTBOX (what a consumer receives; per order, in sequence):\n")
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SUBJECT\tAGGREGATE-ID\tSEQ\tOUTBOX-EVENT-ID\tBODY")
	for m := range batch.Messages() {
		h := m.Headers()
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", m.Subject(), h.Get(broker.HeaderAggregateID),
			h.Get(broker.HeaderAggregateSequence), h.Get(broker.HeaderEventID), m.Data())
	}
	return w.Flush()
}

var errDemoRollback = errors.New("demo: payment declined")
