package cdc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// Rows of a raw INSERT with reserved or invalid headers, or fields beyond the
// limits, come through the stream and are quarantined at once with the reason,
// by the same rule as the polling relay (broker.CheckMessage); none is published,
// and the valid events of other aggregates are.
func TestRawInsertsBeyondTheRulesAreQuarantined(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	rec := &brokertest.Recorder{}
	cfg := e.cfg
	cfg.MaxAttempts = 100
	e.start(t, rec, cfg)

	hostile := []map[string]string{
		{"Nats-Rollup": "all"}, {"nats-expected-stream": "X"}, {"NATS-MSG-ID": "x"}, {"authorization": "Bearer x"},
		{"HOST": "h"}, {"content-type": "text/html"}, {"X-Death": "x"}, {"Outbox-Event-Id": "x"}, {"bcc": "k"},
		{"a:b": "v"}, {"a b": "v"}, {"k": "a\r\nb"}, {"k": " padded"}, {"café": "v"},
		{"big": strings.Repeat("v", 200<<10)}, {"A": "1", "a": "2"},
	}
	for i, h := range hostile {
		hdr, err := json.Marshal(h)
		pgtest.Must(t, err, "headers")
		for seq := 1; seq <= 2; seq++ {
			if seq == 2 {
				hdr = []byte(`{"tenant": "acme"}`)
			}
			_, err = e.pool.Exec(ctx, "INSERT INTO "+e.table()+
				" (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, headers) VALUES ($1, 'raw', $2, $3, 'raw.inserted', '{}', $4::jsonb)",
				pgoutbox.NewEventID(), fmt.Sprintf("r%02d", i), seq, string(hdr))
			pgtest.Must(t, err, "raw insert")
		}
	}
	// Ids no broker carries unchanged (the one name rule, pgoutbox.CheckEventFields).
	badIDs := []string{strings.Repeat("i", pgoutbox.MaxAggregateIDBytes+1), "id ", " id", "id\r\nOutbox-Aggregate-Id: 2", "id\x1b[2J", "id\u0085", "\u3000id"}
	for _, id := range badIDs {
		_, err := e.pool.Exec(ctx, "INSERT INTO "+e.table()+
			" (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload) VALUES ($1, 'raw', $2, 1, 'raw.inserted', '{}')",
			pgoutbox.NewEventID(), id)
		pgtest.Must(t, err, "raw insert")
	}
	var err error
	// Headers that are not strings: the stream must not stop on them.
	for seq := 1; seq <= 2; seq++ {
		_, err = e.pool.Exec(ctx, "INSERT INTO "+e.table()+
			" (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, headers) VALUES ($1, 'raw', 'nonstring', $2, 'raw.inserted', '{}', '{\"k\": 1}')",
			pgoutbox.NewEventID(), seq)
		pgtest.Must(t, err, "raw insert")
	}
	// What only the table's CHECK constraints refused before outbox migration 15:
	// empty names, a schema version below 1, headers that are not a JSON object.
	unchecked := []struct {
		aggType, aggID, evType, headers string
		version                         int
	}{
		{"", "blank-type", "raw.inserted", "{}", 1},
		{"raw", "", "raw.inserted", "{}", 1},
		{"raw", "blank-event", "", "{}", 1},
		{"raw", "version-0", "raw.inserted", "{}", 0},
		{"raw", "version-neg", "raw.inserted", "{}", -3},
		{"raw", "headers-null", "raw.inserted", "null", 1},
		{"raw", "headers-array", "raw.inserted", `["k"]`, 1},
		{"raw", "headers-string", "raw.inserted", `"k"`, 1},
	}
	for _, u := range unchecked {
		_, err = e.pool.Exec(ctx, "INSERT INTO "+e.table()+
			" (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, schema_version, payload, headers) VALUES ($1, $2, $3, 1, $4, $5, '{}', $6::jsonb)",
			pgoutbox.NewEventID(), u.aggType, u.aggID, u.evType, u.version, u.headers)
		pgtest.Must(t, err, "raw insert %+v", u)
	}
	good := e.enqueue(t, 3, 2, 2)

	wait.For(t, 60*time.Second, "the hostile rows to be quarantined", func() bool {
		return e.count(t, "quarantined_at IS NOT NULL") == len(hostile)+len(badIDs)+1+len(unchecked)
	})
	wait.For(t, 60*time.Second, "the valid events", func() bool { return e.count(t, "published_at IS NOT NULL") == len(good) })
	if n := e.count(t, "quarantined_at IS NOT NULL AND (attempt_count <> 1 OR last_error NOT LIKE '%refused before publishing%')"); n != 0 {
		t.Fatalf("%d quarantined rows without one attempt and the reason", n)
	}
	if n := e.count(t, "aggregate_type <> 'acct' AND published_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d raw rows published", n)
	}
	for _, m := range rec.Messages() {
		if m.AggregateType != "acct" {
			t.Fatalf("a hostile event was published: %+v", m)
		}
	}
}
