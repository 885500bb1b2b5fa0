package pgoutbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// limitCase is an event that every enqueue path must refuse (or accept, when
// sqlstate is "").
type limitCase struct {
	name     string
	ev       pgoutbox.Event
	field    string // the ValidationError's field
	sqlstate string // outbox_enqueue's answer; "" when it accepts
}

func headerEvent(h map[string]string) pgoutbox.Event {
	return pgoutbox.Event{AggregateType: "o", AggregateID: "1", EventType: "t", Headers: h}
}

func randomText(n int) string {
	const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = letters[rand.IntN(len(letters))]
	}
	return string(b)
}

func manyHeaders(n, valueLen int) map[string]string {
	h := make(map[string]string, n)
	for i := range n {
		h[fmt.Sprintf("h%03d", i)] = strings.Repeat("v", valueLen)
	}
	return h
}

func hostileCases() []limitCase {
	refuse := func(name string, h map[string]string, state string) limitCase {
		return limitCase{name: name, ev: headerEvent(h), field: "Headers", sqlstate: state}
	}
	var cases []limitCase
	// Reserved names, in every case.
	for _, n := range []string{
		"nats-rollup", "Nats-Rollup", "NATS-EXPECTED-STREAM", "Nats-Expected-Last-Subject-Sequence", "Nats-Msg-Id", "nats-ttl",
		"authorization", "Authorization", "PROXY-AUTHORIZATION", "Proxy-Authenticate", "WWW-Authenticate", "cookie", "Set-Cookie",
		"HOST", "content-type", "Content-Length", "CONTENT-ENCODING", "Transfer-Encoding", "te", "Trailer", "connection",
		"Keep-Alive", "Upgrade", "expect", "Idempotency-Key", "Proxy-Connection",
		"Outbox-Event-Id", "outbox-signature", "OUTBOX-AGGREGATE-SEQUENCE", "Outbox-Signature-Timestamp",
		"X-Death", "x-delay", "x-match", "X-First-Death-Queue", "x-dead-letter-exchange", "x-message-ttl", "x-max-length",
		"x-deduplication-header", "X-Request-Id", "CC", "bcc", "Bcc",
	} {
		cases = append(cases, refuse("reserved "+n, map[string]string{n: "v"}, "22023"))
	}
	// Names that are not tokens.
	for _, n := range []string{
		"", "a:b", "a b", "a\tb", "a\r\nb", "a\nInjected: 1", "caf\u00e9", "名前", "a\x00b", "a\x7fb", "\xff", "(x)", "a/b",
		"a@b", "a=b", "a,b", "a;b", `a"b`, "a{b}", "a?b", "a[b]", "a\\b", " a", "a ",
		strings.Repeat("n", pgoutbox.MaxHeaderNameBytes+1), strings.Repeat("n", 10<<10),
	} {
		cases = append(cases, refuse(fmt.Sprintf("name %.20q", n), map[string]string{n: "v"}, "22023"))
	}
	// Values that would not travel unchanged.
	for _, v := range []string{
		"a\rb", "a\nb", "a\r\nInjected: 1", "a\tb", "\x01", "a\x1fb", "a\x7f", "a\x00b", " leading", "trailing ", " ", "\xff",
	} {
		cases = append(cases, refuse(fmt.Sprintf("value %.20q", v), map[string]string{"k": v}, "22023"))
	}
	cases = append(cases,
		refuse("names differing in case", map[string]string{"Tenant": "a", "tenant": "b"}, "22023"),
		refuse("traceparent twice in two cases", map[string]string{"traceparent": "a", "TraceParent": "b"}, "22023"),
		refuse("too many headers", manyHeaders(pgoutbox.MaxHeaders+1, 1), "54000"),
		refuse("headers above the total", manyHeaders(16, pgoutbox.MaxHeaderBytes/16), "54000"),
		refuse("a 200 KB header", map[string]string{"big": strings.Repeat("v", 200<<10)}, "54000"),
		refuse("a 2 MB header", map[string]string{"big": strings.Repeat("v", 2<<20)}, "54000"),
	)
	// Accepted: at the limits, and the trace context.
	ok := func(name string, ev pgoutbox.Event) limitCase { return limitCase{name: name, ev: ev} }
	atTotal := manyHeaders(16, pgoutbox.MaxHeaderBytes/16-4) // names are 4 bytes
	cases = append(cases,
		ok("trace context", headerEvent(map[string]string{
			"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "a=b", "baggage": "k=v"})),
		ok("tchar name", headerEvent(map[string]string{"!#$%&'*+-.^_`|~09AZaz": "v"})),
		ok("name at its limit", headerEvent(map[string]string{strings.Repeat("n", pgoutbox.MaxHeaderNameBytes): "v"})),
		ok("headers at the count", headerEvent(manyHeaders(pgoutbox.MaxHeaders, 1))),
		ok("headers at the total", headerEvent(atTotal)),
		ok("unicode value", headerEvent(map[string]string{"k": "caf\u00e9 名前 inner  spaces"})),
		ok("empty value", headerEvent(map[string]string{"k": ""})),
		ok("x alone", headerEvent(map[string]string{"x": "v", "nats": "v", "outbox": "v", "content": "v"})),
	)
	// Field lengths, at the limit and one above.
	for _, f := range []struct {
		field string
		limit int
		set   func(*pgoutbox.Event, string)
	}{
		{"AggregateType", pgoutbox.MaxAggregateTypeBytes, func(e *pgoutbox.Event, s string) { e.AggregateType = s }},
		{"AggregateID", pgoutbox.MaxAggregateIDBytes, func(e *pgoutbox.Event, s string) { e.AggregateID = s }},
		{"EventType", pgoutbox.MaxEventTypeBytes, func(e *pgoutbox.Event, s string) { e.EventType = s }},
	} {
		at, above := headerEvent(nil), headerEvent(nil)
		f.set(&at, randomText(f.limit))
		f.set(&above, randomText(f.limit+1))
		cases = append(cases, ok(f.field+" at its limit", at),
			limitCase{name: f.field + " above its limit", ev: above, field: f.field, sqlstate: "54000"})
		multi := headerEvent(nil)
		f.set(&multi, strings.Repeat("é", f.limit/2+1)) // bytes, not characters
		cases = append(cases, limitCase{name: f.field + " multibyte above", ev: multi, field: f.field, sqlstate: "54000"})
	}
	// Names that no broker carries unchanged (pgoutbox.CheckEventFields), and
	// their neighbours that are accepted.
	for _, f := range nameFields {
		for _, v := range hostileNames {
			e := headerEvent(nil)
			f.set(&e, v)
			cases = append(cases, limitCase{name: fmt.Sprintf("%s %+q", f.field, v), ev: e, field: f.field, sqlstate: "22023"})
		}
		for _, v := range fineNames {
			e := headerEvent(nil)
			f.set(&e, v)
			cases = append(cases, ok(fmt.Sprintf("%s %+q", f.field, v), e))
		}
	}
	huge := headerEvent(nil)
	huge.AggregateID = randomText(3000) // fails inside the btree without the limit
	cases = append(cases, limitCase{name: "3000-byte random aggregate id", ev: huge, field: "AggregateID", sqlstate: "54000"})
	return cases
}

// nameFields are the Event fields that the name rule covers.
var nameFields = []struct {
	field string
	set   func(*pgoutbox.Event, string)
}{
	{"AggregateType", func(e *pgoutbox.Event, s string) { e.AggregateType = s }},
	{"AggregateID", func(e *pgoutbox.Event, s string) { e.AggregateID = s }},
	{"EventType", func(e *pgoutbox.Event, s string) { e.EventType = s }},
}

// hostileNames are aggregate types, aggregate ids and event types that every
// enqueue path refuses: white space at an end, control characters (C0, DEL, C1)
// and line separators anywhere.
var hostileNames = []string{
	" ord-1", "ord-1 ", " ", "  ", "ord-1\n", "\nord-1", "ord\n1", "ord\r\nOutbox-Aggregate-Id: 2", "ord\r1", "ord\t1",
	"\tord", "ord-1\t", "ord\x01", "\x1b[2Jord", "ord\x1b]0;title\x07", "ord\x7f", "ord\u0085", "ord\u009b31m",
	"ord\u2028x", "x\u2029", "\u00a0ord", "ord\u00a0", "\u3000ord", "ord\u2003", "\u1680x", "x\u202f", "x\u205f", "\u200ax",
	"ord\v1", "ord\f1",
}

// fineNames are accepted: inner spaces, non-ASCII letters, zero-width and
// format characters that are not white space.
var fineNames = []string{"ord 1", "a  b", "caf\u00e9", "名前", "x\u00a0y", "x\u200by", "\u200bx", "\ufeffx", "o.c-1_2:3/4"}

// Every hostile event is refused by the Go API before any SQL (the transaction
// stays usable) and by outbox_enqueue with the SQLSTATE of its class; the accepted
// ones are accepted by both.
func TestLimitsAndReservedHeaders(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 6)
	sqldb := stdlib.OpenDBFromPool(f.pool)
	t.Cleanup(func() { sqldb.Close() })
	fn := pgx.Identifier{f.schema, "outbox_enqueue"}.Sanitize()
	for _, tc := range hostileCases() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			check := func(path string, err error) {
				t.Helper()
				if tc.sqlstate == "" {
					if err != nil {
						t.Fatalf("%s: refused: %v", path, err)
					}
					return
				}
				var ve *pgoutbox.ValidationError
				if !errors.As(err, &ve) || ve.Field != tc.field {
					t.Fatalf("%s: err = %v, want a *ValidationError about %s", path, err, tc.field)
				}
			}
			valid := ev("valid", 1)
			ev := tc.ev
			ev.Payload = 1

			tx, err := f.pool.Begin(ctx)
			pgtest.Must(t, err, "begin")
			defer tx.Rollback(ctx)
			_, err = f.p.EnqueueTx(ctx, tx, valid, ev)
			check("EnqueueTx", err)
			var one int
			pgtest.Must(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), "statement after the error")
			pgtest.Must(t, tx.Rollback(ctx), "rollback")
			_, err = f.p.QueueTx(ctx, &pgx.Batch{}, ev)
			check("QueueTx", err)
			pgtest.Must(t, f.p.Validate(valid), "validate")
			check("Validate", f.p.Validate(ev))

			stx, err := sqldb.BeginTx(ctx, nil)
			pgtest.Must(t, err, "begin sql")
			defer stx.Rollback()
			_, err = f.p.EnqueueSQLTx(ctx, stx, valid, ev)
			check("EnqueueSQLTx", err)
			pgtest.Must(t, stx.QueryRowContext(ctx, "SELECT 1").Scan(&one), "database/sql statement after the error")
			pgtest.Must(t, stx.Rollback(), "rollback sql")

			hdr, err := json.Marshal(ev.Headers)
			pgtest.Must(t, err, "headers")
			if ev.Headers == nil {
				hdr = []byte("{}")
			}
			if !strings.Contains(string(hdr), `\u0000`) && !strings.Contains(string(hdr), `\ufffd`) {
				state := sqlState(f.pool.QueryRow(ctx, "SELECT "+fn+"($1, $2, $3, '1', 1, $4::jsonb)",
					ev.AggregateType, ev.AggregateID, ev.EventType, string(hdr)).Scan(new(pgoutbox.UUID)))
				if state != tc.sqlstate {
					t.Fatalf("outbox_enqueue: SQLSTATE %q, want %q", state, tc.sqlstate)
				}
			}
		})
	}
}

// sqlState returns err's SQLSTATE, "" for nil and "?" for an error without one.
func sqlState(err error) string {
	if err == nil {
		return ""
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return "? " + err.Error()
}

// Payloads are measured on the jsonb text that is stored and published, by the
// Go API and by outbox_enqueue alike, at the limit and one byte above.
func TestPayloadLimitOnStoredText(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	ctx := context.Background()
	const limit = 64
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: f.schema, MaxPayloadBytes: limit})
	pgtest.Must(t, err, "producer")
	fn := pgx.Identifier{f.schema, "outbox_enqueue"}.Sanitize()

	for _, tc := range []struct {
		name    string
		payload string
	}{
		{"compact array", "[" + strings.TrimSuffix(strings.Repeat("1,", 22), ",") + "]"}, // 45 bytes, 66 stored
		{"compact object", `{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10}`},
		{"exponent", `[1e70]`},
		{"negative exponent", `1e-70`},
		{"scale", `1.00000000000000000000000000000000000000000000000000000000000000000`},
		{"spaced", `[1,   2,  3,    4,  5,  6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]`},
		{"escapes", `"\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9"`},
		{"duplicate keys", `{"a":"` + strings.Repeat("x", 80) + `","a":1}`},
		{"control escapes", `"\u0001\u0002\u0003\u0004\u0005\u0006\u0007\u0008\u0009\u000a\u000b"`},
	} {
		var stored int
		pgtest.Must(t, f.pool.QueryRow(ctx, "SELECT octet_length($1::jsonb::text)", tc.payload).Scan(&stored), "measure")
		got, err := pgoutbox.JSONBTextLength([]byte(tc.payload))
		if err != nil || got != stored {
			t.Errorf("%s: JSONBTextLength = %d, %v; PostgreSQL stores %d bytes", tc.name, got, err, stored)
		}
		goErr := p.Validate(pgoutbox.Event{AggregateType: "o", AggregateID: "1", EventType: "t", Payload: json.RawMessage(tc.payload)})
		if (stored > limit) != errors.Is(goErr, pgoutbox.ErrPayloadTooLarge) {
			t.Errorf("%s: %d bytes stored, Go API: %v", tc.name, stored, goErr)
		}
		tx, err := f.pool.Begin(ctx)
		pgtest.Must(t, err, "begin")
		_, err = tx.Exec(ctx, fmt.Sprintf("SET LOCAL pgoutbox.max_payload_bytes = %d", limit))
		pgtest.Must(t, err, "set")
		state := sqlState(tx.QueryRow(ctx, "SELECT "+fn+"('o', '1', 't', $1::jsonb)", tc.payload).Scan(new(pgoutbox.UUID)))
		_ = tx.Rollback(ctx)
		if want := map[bool]string{true: "54000", false: ""}[stored > limit]; state != want {
			t.Errorf("%s: %d bytes stored, outbox_enqueue SQLSTATE %q, want %q", tc.name, stored, state, want)
		}
	}

	// At the limit and one byte above, on the stored form.
	for _, n := range []int{limit, limit + 1} {
		payload := `"` + strings.Repeat("x", n-2) + `"`
		err := p.Validate(pgoutbox.Event{AggregateType: "o", AggregateID: "1", EventType: "t", Payload: json.RawMessage(payload)})
		if (n > limit) != errors.Is(err, pgoutbox.ErrPayloadTooLarge) {
			t.Errorf("%d bytes: %v", n, err)
		}
	}
}

// A session cannot switch outbox_enqueue's payload limit off or raise it above the
// hard maximum; it may pick any limit up to it.
func TestPayloadLimitSettingCannotBeDisabled(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	ctx := context.Background()
	fn := pgx.Identifier{f.schema, "outbox_enqueue"}.Sanitize()
	big := `"` + strings.Repeat("x", pgoutbox.DefaultMaxPayloadBytes) + `"`
	try := func(setting, payload string) string {
		t.Helper()
		tx, err := f.pool.Begin(ctx)
		pgtest.Must(t, err, "begin")
		defer tx.Rollback(ctx)
		if setting != "" {
			_, err = tx.Exec(ctx, "SELECT set_config('pgoutbox.max_payload_bytes', $1, true)", setting)
			pgtest.Must(t, err, "set")
		}
		return sqlState(tx.QueryRow(ctx, "SELECT "+fn+"('o', '1', 't', $1::jsonb)", payload).Scan(new(pgoutbox.UUID)))
	}
	if s := try("", big); s != "54000" {
		t.Errorf("unset: SQLSTATE %q for a payload above the default", s)
	}
	for _, bad := range []string{"0", "-1", "-0", "67108865", "99999999999", "9223372036854775808", "abc", "1e9", "1.5", "0x10", "+5", "1 000", "NaN", "Infinity"} {
		if s := try(bad, `1`); s != "22023" {
			t.Errorf("setting %q: SQLSTATE %q, want 22023", bad, s)
		}
	}
	if s := try("10", `"0123456789"`); s != "54000" {
		t.Errorf("setting 10: SQLSTATE %q for 12 bytes", s)
	}
	if s := try("67108864", big); s != "" {
		t.Errorf("setting at the hard maximum: SQLSTATE %q", s)
	}
	if s := try("  ", `1`); s != "" {
		t.Errorf("blank setting: SQLSTATE %q, want the default", s)
	}

	// The Go side has the same hard maximum.
	if _, err := pgoutbox.NewProducer(&pgoutbox.Config{MaxPayloadBytes: pgoutbox.HardMaxPayloadBytes + 1}); err == nil {
		t.Error("a limit above HardMaxPayloadBytes accepted")
	}
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{MaxPayloadBytes: -1})
	pgtest.Must(t, err, "negative limit")
	huge := json.RawMessage(`"` + strings.Repeat("x", pgoutbox.HardMaxPayloadBytes) + `"`)
	if err := p.Validate(pgoutbox.Event{AggregateType: "o", AggregateID: "1", EventType: "t", Payload: huge}); !errors.Is(err, pgoutbox.ErrPayloadTooLarge) {
		t.Errorf("a negative limit let %d bytes through: %v", len(huge), err)
	}
}

func TestReservedHeader(t *testing.T) {
	t.Parallel()
	for _, n := range []string{"Outbox-X", "NATS-ROLLUP", "nats-expected-stream", "Authorization", "HOST", "content-type", "X-Death", "cc", "Idempotency-Key"} {
		if reason, ok := pgoutbox.ReservedHeader(n); !ok || reason == "" {
			t.Errorf("%s not reserved", n)
		}
	}
	for _, n := range []string{"traceparent", "tracestate", "baggage", "tenant", "User-Agent", "natsy", "xx"} {
		if _, ok := pgoutbox.ReservedHeader(n); ok {
			t.Errorf("%s reserved", n)
		}
	}
	if names := pgoutbox.ReservedHeaderNames(); len(names) < 20 {
		t.Errorf("ReservedHeaderNames = %v", names)
	}
}

// FuzzHeaderRules: the Go API and outbox_enqueue take the same decision on any
// header name and value.
func FuzzHeaderRules(f *testing.F) {
	for _, s := range [][2]string{
		{"tenant", "acme"}, {"Nats-Rollup", "all"}, {"nats-expected-stream", "S"}, {"authorization", "Bearer x"},
		{"X-Death", "x"}, {"content-type", "a"}, {"Outbox-Event-Id", "1"}, {"HOST", "h"}, {"a:b", "v"}, {"a b", "v"},
		{"a\tb", "v"}, {"a\r\nb", "v"}, {"caf\u00e9", "v"}, {"", "v"}, {strings.Repeat("n", 129), "v"},
		{"k", "a\rb"}, {"k", "a\nb"}, {"k", " x"}, {"k", "x "}, {"k", "\x7f"}, {"k", "é"}, {"traceparent", "00-x"},
		{"CC", "q"}, {"te", "x"}, {"k", strings.Repeat("v", 16384)}, {"k", strings.Repeat("v", 16383)},
	} {
		f.Add(s[0], s[1])
	}
	pool, schema := pgtest.Migrated(f, 2)
	fn := pgx.Identifier{schema, "outbox_enqueue"}.Sanitize()
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, name, value string) {
		hdr, err := json.Marshal(map[string]string{name: value})
		if err != nil || strings.Contains(name+value, "\x00") || !validUTF8(name+value) {
			return // PostgreSQL's text cannot hold it; the Go API refuses it (TestLimitsAndReservedHeaders)
		}
		goErr := p.Validate(headerEvent(map[string]string{name: value}))
		state := sqlState(pool.QueryRow(context.Background(), "SELECT "+fn+"('o', $1, 't', '1', 1, $2::jsonb)",
			"fuzz", string(hdr)).Scan(new(pgoutbox.UUID)))
		if (goErr == nil) != (state == "") || (state != "" && state != "22023" && state != "54000") {
			t.Fatalf("header %q: %q: Go says %v, outbox_enqueue says %q", name, value, goErr, state)
		}
	})
}

func validUTF8(s string) bool { return strings.ToValidUTF8(s, "\ufffd") == s }

// FuzzNameRules: the Go API (the one rule the relay applies too,
// pgoutbox.CheckEventFields) and outbox_enqueue take the same decision on any
// aggregate type, aggregate id and event type.
func FuzzNameRules(f *testing.F) {
	for _, s := range append(append([]string{"order", "ord-1", "", strings.Repeat("i", 256)}, hostileNames...), fineNames...) {
		f.Add(s, uint8(0))
		f.Add(s, uint8(1))
		f.Add(s, uint8(2))
	}
	pool, schema := pgtest.Migrated(f, 2)
	fn := pgx.Identifier{schema, "outbox_enqueue"}.Sanitize()
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, name string, which uint8) {
		if strings.Contains(name, "\x00") || !validUTF8(name) {
			return // PostgreSQL's text cannot hold it; the Go API refuses it (TestLimitsAndReservedHeaders)
		}
		fld := nameFields[int(which)%len(nameFields)]
		e := headerEvent(nil)
		fld.set(&e, name)
		goErr := p.Validate(e)
		fieldErr := pgoutbox.CheckEventFields(e.AggregateType, e.AggregateID, e.EventType)
		if (goErr == nil) != (fieldErr == nil) {
			t.Fatalf("%s %+q: Validate says %v, CheckEventFields (the relay's rule) says %v", fld.field, name, goErr, fieldErr)
		}
		state := sqlState(pool.QueryRow(context.Background(), "SELECT "+fn+"($1, $2, $3, '1')",
			e.AggregateType, e.AggregateID, e.EventType).Scan(new(pgoutbox.UUID)))
		if (goErr == nil) != (state == "") || (state != "" && state != "22023" && state != "54000") {
			t.Fatalf("%s %+q: Go says %v, outbox_enqueue says %q", fld.field, name, goErr, state)
		}
	})
}

// FuzzPayloadSize: JSONBTextLength is the length PostgreSQL's jsonb text has, for
// any JSON that jsonb accepts.
func FuzzPayloadSize(f *testing.F) {
	for _, s := range []string{
		`[1,   2]`, `{"b":1,"a":2,"a":3}`, `1e5`, `-0`, `-0.0e1`, `0.000e-3`, `1E+2`, `12.340e1`, `-1.5e-7`, `"\u00e9\n\t\"\\\/"`,
		`"\ud83d\ude00"`, `"\u001f"`, `"é"`, `{}`, `[]`, `[[], {}, [{}]]`, `null`, `true`, `false`, `{"":""}`,
		`{"a":{"a":{"a":1},"a":2}}`, `100e-2`, `0e5`, `[0.1e1, 10e-1]`,
	} {
		f.Add(s)
	}
	pool, _ := pgtest.Schema(f, 2)
	f.Fuzz(func(t *testing.T, s string) {
		if !json.Valid([]byte(s)) || len(s) > 1<<16 {
			return
		}
		var stored int
		err := pool.QueryRow(context.Background(), "SELECT octet_length($1::jsonb::text)", s).Scan(&stored)
		if err != nil {
			return // jsonb refuses it (\u0000, lone surrogates, numbers out of range): so does the Go API
		}
		got, err := pgoutbox.JSONBTextLength([]byte(s))
		if err != nil || got != stored {
			t.Fatalf("%q: JSONBTextLength = %d, %v; PostgreSQL stores %d bytes", s, got, err, stored)
		}
	})
}
