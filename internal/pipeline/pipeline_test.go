package pipeline_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/pipeline"
	"github.com/pgoutbox/pgoutbox/internal/retry"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// item is a source's batch item: it embeds the pipeline's Event.
type item struct {
	pipeline.Event
	tag string
}

func ev(agg string, seq int64, attempts int) item {
	return item{Event: pipeline.Event{Msg: broker.Message{EventID: pgoutbox.NewEventID(), AggregateType: "order", AggregateID: agg,
		AggregateSequence: seq, EventType: "created", SchemaVersion: 1}, Attempts: attempts}, tag: fmt.Sprintf("%s#%d", agg, seq)}
}

func config(log *bytes.Buffer, notAttempted pipeline.Result) *pipeline.Config {
	return &pipeline.Config{
		Policy:       retry.Policy{MaxAttempts: 3, BackoffBase: time.Second, BackoffMax: time.Minute},
		NotAttempted: notAttempted, Observed: true,
		Log: slog.New(slog.NewTextHandler(log, nil)),
	}
}

func TestJudge(t *testing.T) {
	plain := errors.New("boom")
	for _, tc := range []struct {
		name      string
		attempts  int
		err       error
		abandoned bool
		want      pipeline.Result
		reason    pipeline.FailureReason
		attempt   int
	}{
		{"acked", 0, nil, false, pipeline.ResultPublished, "", 1},
		{"acked at a later attempt", 4, nil, false, pipeline.ResultPublished, "", 5},
		{"ordinary failure retried", 0, plain, false, pipeline.ResultFailed, pipeline.ReasonError, 1},
		{"ordinary failure at MaxAttempts quarantined", 2, plain, false, pipeline.ResultQuarantined, pipeline.ReasonError, 3},
		{"permanent quarantined at once", 0, broker.Permanent(plain), false, pipeline.ResultQuarantined, pipeline.ReasonPermanent, 1},
		{"unavailable never quarantined", 10, broker.Unavailable(plain), false, pipeline.ResultFailed, pipeline.ReasonUnavailable, 11},
		{"misconfigured never quarantined", 10, broker.Misconfigured(plain), false, pipeline.ResultFailed, pipeline.ReasonUnavailable, 11},
		{"predecessor failed: not attempted", 0, fmt.Errorf("x: %w", broker.ErrPredecessorFailed), false, pipeline.ResultReleased, "", 0},
		{"cancelled by a hard stop: not attempted", 0, context.Canceled, true, pipeline.ResultReleased, "", 0},
		{"cancelled without a hard stop: a failure", 0, context.Canceled, false, pipeline.ResultFailed, pipeline.ReasonError, 1},
		{"timed out without a hard stop: an outage", 0, context.DeadlineExceeded, false, pipeline.ResultFailed, pipeline.ReasonUnavailable, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var log bytes.Buffer
			items := []item{ev("1", 1, tc.attempts)}
			j := pipeline.Judge(config(&log, pipeline.ResultReleased), items, []error{tc.err}, tc.abandoned)
			o := j.Events[0]
			if o.Result != tc.want || o.Reason != tc.reason || o.Attempt != tc.attempt || o.EventID != items[0].Msg.EventID {
				t.Fatalf("outcome %+v, want result %s reason %q attempt %d", o, tc.want, tc.reason, tc.attempt)
			}
			acked, failed, skipped := len(j.Acked), len(j.Failed), len(j.NotAttempted)
			switch tc.want {
			case pipeline.ResultPublished:
				if acked != 1 || failed+skipped != 0 || !j.Broker.Acked || j.BrokerDown() {
					t.Fatalf("judged %+v, want one acked", j)
				}
			case pipeline.ResultReleased:
				if skipped != 1 || acked+failed != 0 || j.Broker.Acked || j.Broker.AllUnavailable {
					t.Fatalf("judged %+v, want one not attempted", j)
				}
			default:
				f := j.Failed[0]
				if failed != 1 || f.Index != 0 || f.ID != items[0].Msg.EventID || f.Verdict.Text != retry.ErrorText(tc.err) {
					t.Fatalf("judged %+v, want one failure", j)
				}
				quarantined := tc.want == pipeline.ResultQuarantined
				if f.Verdict.Quarantine != quarantined || (j.Quarantined == 1) != quarantined ||
					strings.Contains(log.String(), "event quarantined") != quarantined {
					t.Fatalf("quarantine %v (%d), log %q; want %v", f.Verdict.Quarantine, j.Quarantined, log.String(), quarantined)
				}
				if (j.RetryIn > 0) == quarantined || j.Broker.FirstError != f.Verdict.Text {
					t.Fatalf("RetryIn %s, FirstError %q", j.RetryIn, j.Broker.FirstError)
				}
				if j.BrokerDown() != (tc.reason == pipeline.ReasonUnavailable) {
					t.Fatalf("BrokerDown %v for reason %s", j.BrokerDown(), tc.reason)
				}
				if (j.Broker.Refused != "") != broker.IsMisconfigured(tc.err) {
					t.Fatalf("Refused %q", j.Broker.Refused)
				}
			}
		})
	}
}

func TestJudgeBatch(t *testing.T) {
	var log bytes.Buffer
	c := config(&log, pipeline.ResultHeld)
	c.QuarantineDelay = 7 * time.Second
	c.Observed = false
	items := []item{ev("a", 1, 0), ev("a", 2, 0), ev("b", 1, 0), ev("c", 1, 0), ev("d", 1, 0)}
	results := []error{
		broker.Permanent(errors.New("refused")), broker.ErrPredecessorFailed, nil,
		broker.Unavailable(errors.New("down")), errors.New("odd"),
	}
	j := pipeline.Judge(c, items, results, false)
	if j.Events != nil {
		t.Fatal("outcomes made without an Observer")
	}
	if len(j.Acked) != 1 || j.Acked[0] != items[2].Msg.EventID || len(j.NotAttempted) != 1 || j.NotAttempted[0] != items[1].Msg.EventID {
		t.Fatalf("acked %v, not attempted %v", j.Acked, j.NotAttempted)
	}
	if len(j.Failed) != 3 || j.Failed[0].Index != 0 || j.Failed[1].Index != 3 || j.Failed[2].Index != 4 || j.Quarantined != 1 {
		t.Fatalf("failed %+v", j.Failed)
	}
	if d := j.Failed[0].Verdict.Delay; d != c.QuarantineDelay {
		t.Fatalf("quarantined delay %s, want QuarantineDelay", d)
	}
	if want := min(j.Failed[1].Verdict.Delay, j.Failed[2].Verdict.Delay); j.RetryIn != want {
		t.Fatalf("RetryIn %s, want the shortest retried backoff %s", j.RetryIn, want)
	}
	if j.BrokerDown() || j.Broker.AllUnavailable {
		t.Fatal("a batch with an ack and ordinary failures counts as the broker down")
	}
	cols := pipeline.FailColumnsOf(j.Failed)
	if len(cols.IDs) != 3 || cols.IDs[1] != items[3].Msg.EventID || !cols.Quarantine[0] || cols.Quarantine[1] ||
		cols.DelaysMs[0] != 7000 || cols.Errors[2] != "odd" {
		t.Fatalf("fail columns %+v", cols)
	}
	var counters pipeline.Counters
	counters.Add(&j)
	if counters.Published.Load() != 1 || counters.Failed.Load() != 3 || counters.Quarantined.Load() != 1 || counters.NotAttempted.Load() != 1 {
		t.Fatal("counters do not match the judged batch")
	}
}

// recorder is a publisher that records what it was handed.
type recorder struct {
	got     []broker.Message
	results func(n int) []error
}

func (r *recorder) Publish(_ context.Context, msgs []broker.Message) []error {
	r.got = append(r.got, msgs...)
	if r.results != nil {
		return r.results(len(msgs))
	}
	return make([]error, len(msgs))
}

func (r *recorder) Close() error { return nil }

func TestPublishSortsRefusesAndChecks(t *testing.T) {
	var log bytes.Buffer
	pub := &recorder{}
	c := config(&log, pipeline.ResultReleased)
	c.Broker, c.Timeout = pub, time.Minute
	items := []item{ev("b", 2, 0), ev("a", 1, 0), ev("b", 1, 0)}
	items[1].Refused = errors.New("headers are not a JSON object")
	results, _ := pipeline.Publish(context.Background(), c, items)
	if got := items[0].tag + " " + items[1].tag + " " + items[2].tag; got != "a#1 b#1 b#2" {
		t.Fatalf("items sorted as %s, want by lane and sequence", got)
	}
	if !broker.IsPermanent(results[0]) || results[1] != nil || results[2] != nil {
		t.Fatalf("results %v, want the refused event failed permanently, the others sent", results)
	}
	if len(pub.got) != 2 || pub.got[0].AggregateID != "b" || pub.got[0].AggregateSequence != 1 {
		t.Fatalf("publisher got %d messages; the refused one must not be sent", len(pub.got))
	}

	pub.results = func(int) []error { return []error{nil} }
	results, _ = pipeline.Publish(context.Background(), c, []item{ev("a", 1, 0), ev("b", 1, 0)})
	if len(results) != 2 || !errors.Is(results[0], retry.ErrWrongResultCount) || !broker.IsUnavailable(results[1]) {
		t.Fatalf("results %v, want every event unavailable for a wrong result count", results)
	}
	if !strings.Contains(log.String(), "wrong number of results") {
		t.Fatalf("log %q", log.String())
	}
	if un := pipeline.Unavailable(2, errors.New("failpoint")); len(un) != 2 || !broker.IsUnavailable(un[1]) {
		t.Fatalf("Unavailable: %v", un)
	}
}

func TestDecodeHeaders(t *testing.T) {
	id := pgoutbox.NewEventID()
	for _, tc := range []struct {
		raw     string
		want    map[string]string
		refused bool
	}{
		{`{}`, nil, false},
		{`{"a":"1"}`, map[string]string{"a": "1"}, false},
		{`{"a":1}`, nil, true},
		{`[]`, nil, true},
		{`null`, nil, true},
		{`"x"`, nil, true},
		{`1`, nil, true},
		{`true`, nil, true},
	} {
		h, err := pipeline.DecodeHeaders("relay", id, []byte(tc.raw))
		if (err != nil) != tc.refused || len(h) != len(tc.want) || (len(tc.want) > 0 && h["a"] != tc.want["a"]) {
			t.Fatalf("%s: headers %v, error %v", tc.raw, h, err)
		}
		if err != nil && (!strings.HasPrefix(err.Error(), "relay: event "+id.String()+" refused before publishing") || h != nil) {
			t.Fatalf("%s: refusal %q", tc.raw, err)
		}
	}
}

func TestResultStrings(t *testing.T) {
	for r, want := range map[pipeline.Result]string{pipeline.ResultPublished: "published", pipeline.ResultFailed: "failed",
		pipeline.ResultQuarantined: "quarantined", pipeline.ResultReleased: "released", pipeline.ResultHeld: "held", 0: "unknown"} {
		if r.String() != want {
			t.Errorf("%d: %q, want %q", r, r.String(), want)
		}
	}
	if pipeline.ClassifyFailure(broker.Permanent(errors.New("x"))) != pipeline.ReasonPermanent ||
		pipeline.ClassifyFailure(fmt.Errorf("ack: %w", context.DeadlineExceeded)) != pipeline.ReasonUnavailable ||
		pipeline.ClassifyFailure(errors.New("x")) != pipeline.ReasonError {
		t.Fatal("ClassifyFailure disagrees with broker.ClassifyFailure")
	}
}

var (
	errDown     = errors.New("t: database unreachable")
	errDenied   = fmt.Errorf("t: %w", migrate.ErrPermissionDenied)
	errUnusable = errors.New("t: outbox unusable")
	errStuck    = errors.New("t: stuck")
	errBroker   = errors.New("t: broker unreachable")
	errRefuses  = errors.New("t: broker refuses")
)

func health(log *bytes.Buffer, distinguish bool) *pipeline.Health {
	h := &pipeline.Health{
		Errs: pipeline.Sentinels{DatabaseUnreachable: errDown, PermissionDenied: errDenied,
			BrokerUnreachable: errBroker, BrokerMisconfigured: errRefuses},
		Log: slog.New(slog.NewTextHandler(log, nil)), Name: "the test", Role: "relay",
	}
	if distinguish {
		h.Errs.OutboxUnusable, h.Errs.OutboxStuck = errUnusable, errStuck
	}
	return h
}

func TestHealth(t *testing.T) {
	denied := &pgconn.PgError{Code: "42501", Message: "permission denied for table outbox_events"}
	undefined := &pgconn.PgError{Code: "42P01", Message: "relation does not exist"}
	noSchema := &pgconn.PgError{Code: "3F000", Message: "schema does not exist"}
	lock := &pgconn.PgError{Code: "55P03", Message: "lock timeout"}
	refused := errors.New("connection refused")
	for _, tc := range []struct {
		name        string
		distinguish bool // the source tells unusable and stuck apart (the relay)
		err         error
		want        error
		unreachable bool
	}{
		{"unreachable", true, refused, errDown, true},
		{"permission denied", true, fmt.Errorf("claim: %w", denied), errDenied, false},
		{"permission denied, cdc", false, denied, errDenied, false},
		{"outbox unusable", true, undefined, errUnusable, false},
		{"schema gone", true, noSchema, errUnusable, false},
		{"outbox unusable, not told apart", false, undefined, errDown, true},
		{"stuck", true, lock, errStuck, false},
		{"stuck, not told apart", false, lock, errDown, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var log bytes.Buffer
			h := health(&log, tc.distinguish)
			if err := errors.Join(h.Errors()...); err != nil {
				t.Fatalf("new Health reports %v", err)
			}
			if got := h.Failed("claim", tc.err); got != tc.unreachable {
				t.Fatalf("Failed reports unreachable %v", got)
			}
			h.Failed("claim", tc.err) // logged once
			err := errors.Join(h.Errors()...)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Errors %v, want %v", err, tc.want)
			}
			if tc.want == errDenied && !errors.Is(err, migrate.ErrPermissionDenied) {
				t.Fatal("permission denied does not match migrate.ErrPermissionDenied")
			}
			if lines := strings.Count(log.String(), "\n"); lines != 1 {
				t.Fatalf("%d log lines for a repeated failure, want 1: %s", lines, log.String())
			}
			if h.Refused("claim") != (!tc.unreachable) || h.Refused("settle") != (tc.want == errUnusable) {
				t.Fatalf("Refused(claim) %v, Refused(settle) %v", h.Refused("claim"), h.Refused("settle"))
			}
			h.OK("settle") // another statement: clears only what is not the claim's
			if err := errors.Join(h.Errors()...); (tc.want == errDenied || tc.want == errStuck) && !errors.Is(err, tc.want) {
				t.Fatalf("a settle's success cleared the claim's %v", tc.want)
			}
			h.OK("claim")
			if err := errors.Join(h.Errors()...); err != nil || h.Refused("claim") {
				t.Fatalf("after success: %v", err)
			}
		})
	}
}

func TestHealthPerStatementAndBroker(t *testing.T) {
	var log bytes.Buffer
	h := health(&log, true)
	h.Failed("settle", &pgconn.PgError{Code: "42501", Message: "no UPDATE"})
	h.Failed("claim", &pgconn.PgError{Code: "42501", Message: "no SELECT"})
	h.Settled(retry.BatchOutcome{AllUnavailable: true, FirstError: "dial tcp: refused"})
	errs := h.Errors()
	if len(errs) != 3 || !strings.Contains(errs[0].Error(), "no SELECT") || !strings.Contains(errs[1].Error(), "no UPDATE") ||
		!errors.Is(errs[2], errBroker) {
		t.Fatalf("errors %v, want the claim's and the settle's denial, then the broker", errs)
	}
	h.Settled(retry.BatchOutcome{AllUnavailable: true, Refused: "401 Unauthorized"})
	if err := errors.Join(h.Errors()...); !errors.Is(err, errRefuses) || errors.Is(err, errBroker) || !strings.Contains(err.Error(), "401") {
		t.Fatalf("errors %v, want the broker refusing with its answer", err)
	}
	h.Settled(retry.BatchOutcome{Acked: true})
	h.OK("claim")
	h.OK("settle")
	if err := errors.Join(h.Errors()...); err != nil {
		t.Fatalf("after success: %v", err)
	}
	h.Unreachable(errors.New("probe failed"))
	if err := errors.Join(h.Errors()...); !errors.Is(err, errDown) {
		t.Fatalf("after a failed probe: %v", err)
	}
	h.Reachable()
	if err := errors.Join(h.Errors()...); err != nil {
		t.Fatalf("after a probe: %v", err)
	}
}
