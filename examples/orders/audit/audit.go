// Package audit checks the order example's end state against its promise: every
// order has its events, every event was published, and every order was reserved
// (and, if cancelled, released) exactly once and charged exactly once — read from
// the services' tables and the payment API's own records, never from their
// counters.
package audit

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/examples/orders"
	"github.com/pgoutbox/pgoutbox/examples/orders/fakepay"
)

// Querier is *pgxpool.Pool, *pgx.Conn or pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Progress is how far the pipeline has got.
type Progress struct {
	Orders      int64 // orders in the orders table
	Events      int64 // order events in the outbox
	Unpublished int64 // of them, not yet published
	// OldestPendingSeconds is the age of the oldest unpublished event (0: none).
	OldestPendingSeconds float64
	// Processed counts the events each consumer name has applied (or found
	// irrelevant): processed_events rows.
	Processed map[string]int64
}

// Drained reports whether every event is published and processed by every consumer
// named.
func (p Progress) Drained(consumers ...string) bool {
	if p.Unpublished > 0 {
		return false
	}
	for _, c := range consumers {
		if p.Processed[c] != p.Events {
			return false
		}
	}
	return true
}

// ReadProgress reads the pipeline's progress in schema.
func ReadProgress(ctx context.Context, db Querier, schema string) (Progress, error) {
	t := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	p := Progress{Processed: map[string]int64{}}
	err := db.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+t("orders")+"), count(*), count(*) FILTER (WHERE published_at IS NULL),"+
		" coalesce(extract(epoch FROM now() - min(occurred_at) FILTER (WHERE published_at IS NULL)), 0)::float8"+
		" FROM "+t("outbox_events")+" WHERE aggregate_type = $1", orders.AggregateType).Scan(
		&p.Orders, &p.Events, &p.Unpublished, &p.OldestPendingSeconds)
	if err != nil {
		return p, fmt.Errorf("read outbox progress: %w", err)
	}
	rows, err := db.Query(ctx, "SELECT consumer_name, count(*) FROM "+t("processed_events")+" GROUP BY consumer_name")
	if err != nil {
		return p, fmt.Errorf("read inbox progress: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			return p, fmt.Errorf("read inbox progress: %w", err)
		}
		p.Processed[name] = n
	}
	return p, rows.Err()
}

// Report is the outcome of Check.
type Report struct {
	Orders    int // orders created
	Cancelled int // of them, cancelled
	Events    int // order events in the outbox, all published unless Problems says otherwise

	ReservedOnce   int // orders with exactly one reservation (or one out-of-stock record)
	ReleasedOnce   int // cancelled orders whose reservation was released exactly once, after it was made
	ChargedOnce    int // orders with exactly one charge at the payment API and one payment row
	DoubleCharges  int // orders charged more than once at the payment API
	RepeatedCalls  int // charge requests beyond the first per key: retries the key absorbed
	PaymentCharges int // charges recorded by the payment API

	// Problems lists what breaks the promise, at most MaxProblems of them.
	Problems []string
	// ProblemCount is the number of problems found, listed or not.
	ProblemCount int
}

// MaxProblems bounds Report.Problems.
const MaxProblems = 10

// OK reports whether the promise held: no problems.
func (r *Report) OK() bool { return r.ProblemCount == 0 }

func (r *Report) problem(format string, args ...any) {
	r.ProblemCount++
	if len(r.Problems) < MaxProblems {
		r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
	}
}

// Check audits schema and the payment API's charges. It returns an error only when
// it could not read; a broken promise is in the Report.
func Check(ctx context.Context, db Querier, schema string, charges []fakepay.Charge) (*Report, error) {
	t := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	r := &Report{PaymentCharges: len(charges)}
	perOrder := map[string][]fakepay.Charge{}
	for _, c := range charges {
		perOrder[c.OrderID] = append(perOrder[c.OrderID], c)
		r.RepeatedCalls += c.Requests - 1
	}
	rows, err := db.Query(ctx, `
WITH e AS (
    SELECT aggregate_id,
           count(*) FILTER (WHERE event_type = $1) AS created,
           count(*) FILTER (WHERE event_type = $2) AS cancelled,
           count(*) FILTER (WHERE published_at IS NULL) AS unpublished
    FROM `+t("outbox_events")+` WHERE aggregate_type = $3 GROUP BY aggregate_id),
m AS (
    SELECT order_id,
           count(*) FILTER (WHERE kind IN ('reserve', 'out_of_stock')) AS reservations,
           count(*) FILTER (WHERE kind = 'reserve') AS reserved,
           count(*) FILTER (WHERE kind = 'release') AS releases,
           coalesce(min(id) FILTER (WHERE kind = 'reserve') < min(id) FILTER (WHERE kind = 'release'), true) AS in_order
    FROM `+t("inventory_movements")+` GROUP BY order_id),
p AS (SELECT order_id, count(*) AS payments, min(charge_id) AS charge_id FROM `+t("payments")+` GROUP BY order_id)
SELECT o.id, o.status = 'cancelled', coalesce(e.created, 0), coalesce(e.cancelled, 0), coalesce(e.unpublished, 0),
       coalesce(m.reservations, 0), coalesce(m.reserved, 0), coalesce(m.releases, 0), coalesce(m.in_order, true),
       coalesce(p.payments, 0), coalesce(p.charge_id, '')
FROM `+t("orders")+` o
LEFT JOIN e ON e.aggregate_id = o.id
LEFT JOIN m ON m.order_id = o.id
LEFT JOIN p ON p.order_id = o.id
ORDER BY o.id`, orders.EventOrderCreated, orders.EventOrderCancelled, orders.AggregateType)
	if err != nil {
		return nil, fmt.Errorf("audit orders: %w", err)
	}
	known := map[string]bool{}
	for rows.Next() {
		var id, chargeID string
		var cancelled, inOrder bool
		var created, cancels, unpublished, reservations, reserved, releases, payments int
		if err := rows.Scan(&id, &cancelled, &created, &cancels, &unpublished, &reservations, &reserved, &releases, &inOrder,
			&payments, &chargeID); err != nil {
			rows.Close()
			return nil, fmt.Errorf("audit orders: %w", err)
		}
		known[id] = true
		r.Orders++
		r.Events += created + cancels
		wantCancels := 0
		if cancelled {
			r.Cancelled++
			wantCancels = 1
		}
		if created != 1 || cancels != wantCancels {
			r.problem("order %s has %d %s and %d %s events", id, created, orders.EventOrderCreated, cancels, orders.EventOrderCancelled)
		}
		if unpublished > 0 {
			r.problem("order %s has %d unpublished events", id, unpublished)
		}
		if reservations == 1 {
			r.ReservedOnce++
		} else {
			r.problem("order %s was reserved %d times", id, reservations)
		}
		switch wantReleases := min(reserved, wantCancels); {
		case releases != wantReleases:
			r.problem("order %s (cancelled: %t) was released %d times", id, cancelled, releases)
		case !inOrder:
			r.problem("order %s was released before it was reserved", id)
		case cancelled:
			r.ReleasedOnce++
		}
		chs := perOrder[id]
		switch {
		case len(chs) > 1:
			r.DoubleCharges++
			r.problem("order %s was charged %d times by the payment API", id, len(chs))
		case len(chs) == 0:
			r.problem("order %s was never charged", id)
		case payments != 1 || chargeID != chs[0].ID:
			r.problem("order %s: %d payment rows (charge %q), the payment API has charge %s", id, payments, chargeID, chs[0].ID)
		default:
			r.ChargedOnce++
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("audit orders: %w", err)
	}
	for id, chs := range perOrder {
		if !known[id] {
			r.problem("the payment API charged unknown order %s %d times", id, len(chs))
		}
	}
	// Stock counters against the ledger, and ledger rows of unknown orders.
	var badStock, orphans int
	if err := db.QueryRow(ctx, `
SELECT (SELECT count(*) FROM `+t("inventory_stock")+` s WHERE s.reserved <>
            (SELECT coalesce(sum(CASE kind WHEN 'reserve' THEN quantity WHEN 'release' THEN -quantity ELSE 0 END), 0)
             FROM `+t("inventory_movements")+` m WHERE m.sku = s.sku)),
       (SELECT count(*) FROM `+t("inventory_movements")+` m WHERE NOT EXISTS (SELECT FROM `+t("orders")+` o WHERE o.id = m.order_id))
       + (SELECT count(*) FROM `+t("payments")+` p WHERE NOT EXISTS (SELECT FROM `+t("orders")+` o WHERE o.id = p.order_id))`).Scan(
		&badStock, &orphans); err != nil {
		return nil, fmt.Errorf("audit stock: %w", err)
	}
	if badStock > 0 {
		r.problem("%d SKUs have a reserved count that disagrees with the ledger", badStock)
	}
	if orphans > 0 {
		r.problem("%d ledger or payment rows belong to no order", orphans)
	}
	return r, nil
}

// Summary is a one-line account of the figures.
func (r *Report) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d orders (%d cancelled), %d events: %d reserved once, %d released once, %d charged once",
		r.Orders, r.Cancelled, r.Events, r.ReservedOnce, r.ReleasedOnce, r.ChargedOnce)
	fmt.Fprintf(&b, " (%d charges at the payment API, %d double, %d repeated calls absorbed by the key)",
		r.PaymentCharges, r.DoubleCharges, r.RepeatedCalls)
	return b.String()
}
