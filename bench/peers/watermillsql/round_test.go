package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// One round through the protocol commits transactions, each with its business
// row and one watermill-sql row (the forwarder's envelope) — as many of one as
// of the other, warm-up included — and reports them.
func TestRoundCommitsRowsInPairs(t *testing.T) {
	pool, schema := pgtest.Schema(t, 2)
	ctx := context.Background()
	orders := pgx.Identifier{schema, "orders"}.Sanitize()
	_, err := pool.Exec(ctx, "CREATE TABLE "+orders+" (id bigint PRIMARY KEY, customer text NOT NULL, total_cents int NOT NULL)")
	pgtest.Must(t, err, "create the business table")
	pr, pw := io.Pipe()
	var out bytes.Buffer
	errc := make(chan error, 1)
	go func() {
		errc <- runMain(ctx, []string{"-schema", schema, "-producers", "2", "-duration", "1s", "-first-id", "100",
			"-business-sql", "INSERT INTO " + orders + " VALUES ($1, 'c-42', 1999)", "-payload", `{"customer":"c-42","pad":"xxxx"}`},
			pgtest.URL(), pr, &out)
	}()
	_, _ = pw.Write([]byte("go\n"))
	_ = pw.Close()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("output %q, want two lines", out.String())
	}
	var ready struct {
		BackendPids []int `json:"backend_pids"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &ready); err != nil || len(ready.BackendPids) != 2 || ready.BackendPids[0] == ready.BackendPids[1] {
		t.Errorf("first line %q (%v): want 2 distinct backend pids", lines[0], err)
	}
	var res roundResult
	pgtest.Must(t, json.Unmarshal([]byte(lines[1]), &res), "decode %q", lines[1])
	if res.Commits <= 0 || res.Seconds <= 0 || res.CPUNs <= 0 || res.Latency == nil {
		t.Errorf("result %+v", res)
	}
	var business, messages, minID, maxID int64
	pgtest.Must(t, pool.QueryRow(ctx, "SELECT count(*), min(id), max(id) FROM "+orders).Scan(&business, &minID, &maxID), "count orders")
	pgtest.Must(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, "watermill_" + ForwarderTopic}.Sanitize()+
		" WHERE payload->>'destination_topic' = $1", Topic).Scan(&messages), "count messages")
	if business != messages || business != res.Commits+2 || minID != 100 || maxID != res.LastID {
		t.Errorf("%d business rows (ids %d..%d), %d messages; %d commits + 2 warm-ups, last id %d", business, minID, maxID, messages, res.Commits, res.LastID)
	}
}

// A missing setting is named before anything connects, and a round stops at
// the end of its input without the go-ahead line.
func TestRoundRefusesMissingSettings(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tc := range []struct {
		args []string
		url  string
		want string
	}{
		{[]string{"-schema", "s", "-business-sql", "x", "-duration", "1s", "-payload", "{}"}, "", "DATABASE_URL"},
		{[]string{"-business-sql", "x", "-duration", "1s", "-payload", "{}"}, "postgres://x", "-schema"},
		{[]string{"-schema", "s", "-business-sql", "x", "-payload", "{}"}, "postgres://x", "-duration"},
		{[]string{"-schema", "s", "-business-sql", "x", "-duration", "1s", "-producers", "65", "-payload", "{}"}, "postgres://x", "-producers 65"},
		{[]string{"-schema", "s", "-business-sql", "x", "-duration", "1s", "-payload", "[1]"}, "postgres://x", "not a JSON object"},
		{[]string{"-schema", "s", "-business-sql", "x", "-duration", "1s"}, "postgres://x", "-payload"},
		{[]string{"-schema", "s", "-business-sql", "x", "-duration", "1s", "-payload", "{}"}, "postgres://user:s3cret@%zz", "cannot be parsed"},
	} {
		err := runMain(ctx, tc.args, tc.url, strings.NewReader(""), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%v: %v, want an error naming %q", tc.args, err, tc.want)
		}
	}
	pool, schema := pgtest.Schema(t, 1)
	orders := pgx.Identifier{schema, "orders"}.Sanitize()
	_, err := pool.Exec(ctx, "CREATE TABLE "+orders+" (id bigint PRIMARY KEY)")
	pgtest.Must(t, err, "create the business table")
	err = runMain(ctx, []string{"-schema", schema, "-duration", "1s", "-payload", "{}", "-business-sql", "INSERT INTO " + orders + " VALUES ($1)"},
		pgtest.URL(), strings.NewReader(""), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "go-ahead") {
		t.Errorf("without the go-ahead: %v", err)
	}
}
