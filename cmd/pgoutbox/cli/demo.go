package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/migrate"
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
enqueue through the outbox_enqueue SQL function. It prints the outbox and what
each step proves.

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
	fmt.Fprintf(out, "\n%d orders, %d events: every committed change has its events, the rolled-back one has none.\n", orders, n)
	if psqlURL != "" {
		fmt.Fprintf(out, "Inspect with: psql '%s' -c 'TABLE %s.outbox_events'\n", psqlURL, q)
	}
	return nil
}

var errDemoRollback = errors.New("demo: payment declined")
