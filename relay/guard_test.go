package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
)

// rawRow is an outbox row written around the producer's checks, by a raw INSERT.
type rawRow struct {
	name                  string
	aggType, aggID, evTyp string
	blank                 string // "aggregate_type", "aggregate_id" or "event_type": written empty
	version               int    // schema_version; 0 means 1
	headers               string // JSON
	payload               string // JSON
}

// hostileRawRows are rows the Go API and outbox_enqueue refuse; a raw INSERT can
// still write them.
func hostileRawRows() []rawRow {
	hdr := func(name string, h map[string]string) rawRow {
		b, _ := json.Marshal(h)
		return rawRow{name: name, headers: string(b)}
	}
	rows := []rawRow{
		hdr("nats-rollup", map[string]string{"Nats-Rollup": "all"}),
		hdr("nats-rollup lower", map[string]string{"nats-rollup": "sub"}),
		hdr("expected stream", map[string]string{"NATS-EXPECTED-STREAM": "OTHER"}),
		hdr("expected last seq", map[string]string{"Nats-Expected-Last-Sequence": "1"}),
		hdr("msg id", map[string]string{"Nats-Msg-Id": "spoof"}),
		hdr("authorization", map[string]string{"authorization": "Bearer stolen"}),
		hdr("host", map[string]string{"HOST": "evil.example"}),
		hdr("content-type", map[string]string{"content-type": "text/html"}),
		hdr("x-death", map[string]string{"X-Death": "x"}),
		hdr("outbox spoof", map[string]string{"Outbox-Event-Id": "00000000-0000-0000-0000-000000000000"}),
		hdr("cc", map[string]string{"CC": "other.key"}),
		hdr("colon name", map[string]string{"a:b": "v"}),
		hdr("space name", map[string]string{"a b": "v"}),
		hdr("crlf value", map[string]string{"k": "a\r\nNats-Rollup: all"}),
		hdr("tab value", map[string]string{"k": "a\tb"}),
		hdr("unicode name", map[string]string{"caf\u00e9": "v"}),
		hdr("10 KB name", map[string]string{strings.Repeat("n", 10<<10): "v"}),
		hdr("200 KB value", map[string]string{"big": strings.Repeat("v", 200<<10)}),
		hdr("case twins", map[string]string{"Tenant": "a", "tenant": "b"}),
		{name: "non-string value", headers: `{"k": 1}`},
		{name: "aggregate id too long", aggID: strings.Repeat("i", pgoutbox.MaxAggregateIDBytes+1)},
		{name: "aggregate type too long", aggType: strings.Repeat("t", pgoutbox.MaxAggregateTypeBytes+1)},
		{name: "event type too long", evTyp: strings.Repeat("e", pgoutbox.MaxEventTypeBytes+1)},
		{name: "aggregate id trailing space", aggID: "ord-1 "},
		{name: "aggregate id leading space", aggID: " ord-1"},
		{name: "aggregate id newline", aggID: "ord-1\r\nOutbox-Aggregate-Id: 2"},
		{name: "aggregate id escape", aggID: "ord\x1b]0;title\x07"},
		{name: "aggregate id C1", aggID: "ord\u0085"},
		{name: "aggregate id no-break space", aggID: "\u00a0ord"},
		{name: "event type newline", evTyp: "created\n"},
		{name: "event type line separator", evTyp: "created\u2028x"},
		{name: "aggregate type tab", aggType: "raw\t"},
		// What only the table's CHECK constraints refused before outbox migration 15.
		{name: "empty aggregate type", blank: "aggregate_type"},
		{name: "empty aggregate id", blank: "aggregate_id"},
		{name: "empty event type", blank: "event_type"},
		{name: "schema version 0", version: -100},
		{name: "schema version -1", version: -1},
		{name: "headers an array", headers: `["k", "v"]`},
		{name: "headers a string", headers: `"k: v"`},
		{name: "headers a number", headers: `1`},
		{name: "headers JSON null", headers: `null`},
	}
	many := map[string]string{}
	for i := range pgoutbox.MaxHeaders + 1 {
		many[fmt.Sprintf("h%d", i)] = "v"
	}
	rows = append(rows, hdr("too many headers", many))
	for i := range rows {
		r := &rows[i]
		if r.aggType == "" {
			r.aggType = "raw"
		}
		if r.aggID == "" {
			r.aggID = fmt.Sprintf("r%02d", i)
		}
		if r.evTyp == "" {
			r.evTyp = "raw.inserted"
		}
		if r.headers == "" {
			r.headers = "{}"
		}
		switch r.version {
		case 0:
			r.version = 1
		case -100:
			r.version = 0
		}
		switch r.blank {
		case "aggregate_type":
			r.aggType = ""
		case "aggregate_id":
			r.aggID = ""
		case "event_type":
			r.evTyp = ""
		}
		r.payload = `{"n": 1}`
	}
	return rows
}

// Rows of a raw INSERT that carry reserved or invalid headers, or fields beyond
// the limits, are quarantined at once with the reason in last_error, and never
// reach the NATS stream; the events behind them in their aggregate wait, and other
// aggregates are published.
func TestRawInsertsBeyondTheRulesAreQuarantined(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 4)
	ctx := context.Background()
	target := natstest.New(t, natstest.URL())
	rows := hostileRawRows()
	for _, r := range rows {
		for seq := 1; seq <= 2; seq++ {
			headers, version := r.headers, r.version
			if seq == 2 {
				headers, version = `{"tenant": "acme"}`, 1 // valid, but behind a poison event
			}
			_, err := o.pool.Exec(ctx, "INSERT INTO "+o.table()+
				" (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, schema_version, payload, headers) VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8::jsonb)",
				pgoutbox.NewEventID(), r.aggType, r.aggID, seq, r.evTyp, version, r.payload, headers)
			pgtest.Must(t, err, "raw insert %s", r.name)
		}
	}
	// The one CHECK the table keeps (outbox migration 15): a sequence below 1 would
	// count as delivered to every destination (a lane's cursor starts at 0).
	for _, seq := range []int{0, -1} {
		_, err := o.pool.Exec(ctx, "INSERT INTO "+o.table()+
			" (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload) VALUES ($1, 'raw', 'seq-below-1', $2, 'raw.inserted', '{}')",
			pgoutbox.NewEventID(), seq)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23514" || pgErr.ConstraintName != "outbox_events_aggregate_sequence_check" {
			t.Fatalf("raw insert of sequence %d: %v, want the sequence's CHECK violation", seq, err)
		}
	}
	good := o.enqueue(t, 3, 2)

	pub := dialNATS(t, natstest.URL(), target)
	startRelay(t, o, pub, relay.Config{MaxAttempts: 100})
	wait.For(t, 30*time.Second, "the hostile rows to be quarantined", func() bool {
		return o.count(t, "quarantined_at IS NOT NULL") == len(rows)
	})
	wait.For(t, 30*time.Second, "the valid aggregates to be published", func() bool {
		return o.count(t, "published_at IS NOT NULL") == len(good)
	})
	var bad int
	pgtest.Must(t, o.pool.QueryRow(ctx, "SELECT count(*) FROM "+o.table()+
		" WHERE quarantined_at IS NOT NULL AND (attempt_count <> 1 OR aggregate_sequence <> 1 OR last_error NOT LIKE '%refused before publishing%')").Scan(&bad), "check")
	if bad != 0 {
		rs, _ := o.pool.Query(ctx, "SELECT aggregate_id, attempt_count, last_error FROM "+o.table()+" WHERE quarantined_at IS NOT NULL")
		for rs.Next() {
			var id, e string
			var n int
			_ = rs.Scan(&id, &n, &e)
			t.Logf("%.20s attempts %d: %s", id, n, e)
		}
		rs.Close()
		t.Fatalf("%d quarantined rows without one attempt and a clear reason", bad)
	}
	if n := o.count(t, "aggregate_sequence = 2 AND aggregate_type <> 'acct' AND published_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d events published behind a quarantined one", n)
	}
	var reasons []string
	rs, err := o.pool.Query(ctx, "SELECT last_error FROM "+o.table()+" WHERE quarantined_at IS NOT NULL ORDER BY aggregate_id")
	pgtest.Must(t, err, "reasons")
	for rs.Next() {
		var e string
		pgtest.Must(t, rs.Scan(&e), "scan")
		reasons = append(reasons, e)
	}
	rs.Close()
	for _, want := range []string{"reserved", "Nats-Rollup", "not allowed in a header name", "control character", "white space", "line separator", "above the limit", "differ only in case", "JSON", "must not be empty", "schema version 0 is below 1", "schema version -1 is below 1", ": null"} {
		found := false
		for _, e := range reasons {
			found = found || strings.Contains(e, want)
		}
		if !found {
			t.Errorf("no quarantine reason mentions %q: %q", want, reasons)
		}
	}

	// The stream holds the valid events only, none of the hostile ones.
	got := target.Read(t)
	if len(got) != len(good) {
		t.Fatalf("%d messages on the stream, want the %d valid events", len(got), len(good))
	}
	for _, m := range got {
		if m.AggregateType != "acct" {
			t.Fatalf("a hostile event reached the stream: %+v", m)
		}
		for k := range m.Headers {
			if _, reserved := pgoutbox.ReservedHeader(k); reserved && !strings.HasPrefix(strings.ToLower(k), "nats-") {
				t.Fatalf("reserved header %s on the stream", k)
			}
		}
	}
}
