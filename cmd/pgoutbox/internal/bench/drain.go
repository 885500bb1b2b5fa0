package bench

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DrainResult is the drain scenario: a backlog timed through 1, 2, 4… relays per
// broker, beside the raw-SQL ceiling on the same backlog.
type DrainResult struct {
	Events       int    `json:"events"`
	Aggregates   int    `json:"aggregates"`
	PayloadBytes int    `json:"payload_bytes"`
	BatchSize    int    `json:"batch_size"`
	Method       string `json:"method"`

	// Ceiling holds each ceiling run in order: both variants first, then the
	// faster one before every relay run and after the last. CeilingEventsPerSec is
	// the faster variant's median; each run's ratio uses the ceilings around it.
	Ceiling             []CeilingRun `json:"ceiling"`
	CeilingEventsPerSec float64      `json:"ceiling_events_per_s"`
	CeilingSQL          string       `json:"ceiling_sql"`

	Runs []DrainRun `json:"runs"`
}

// CeilingRun is one timing of the raw-SQL ceiling.
type CeilingRun struct {
	Variant      string  `json:"variant"`
	Seconds      float64 `json:"seconds"`
	EventsPerSec float64 `json:"events_per_s"`
	Statements   int     `json:"statements"`
}

// DrainRun is one backlog drained by some relays to one broker.
type DrainRun struct {
	// Source is the relays' source: poll, or cdc (one relay following the
	// outbox through a replication slot). Empty in JSON of older runs: poll.
	Source string `json:"source,omitempty"`
	// CDCSlot is the slot (and publication) a cdc run created and dropped.
	CDCSlot      string  `json:"cdc_slot,omitempty"`
	Broker       string  `json:"broker"`
	Relays       int     `json:"relays"`
	Seconds      float64 `json:"seconds"`
	EventsPerSec float64 `json:"events_per_s"`
	// CeilingEventsPerSec is the mean of the ceilings timed just before and after
	// this run; RatioToCeiling divides by it.
	CeilingEventsPerSec float64 `json:"ceiling_events_per_s"`
	RatioToCeiling      float64 `json:"ratio_to_ceiling"`
	// BrokerCeilingEventsPerSec is the broker alone, timed just before this run:
	// the same events published by as many publishers as relays, in batches of
	// the same size, with no database (NATS only; 0 when not timed).
	BrokerCeilingEventsPerSec float64 `json:"broker_ceiling_events_per_s,omitempty"`
	// CombinedCeilingEventsPerSec is the limit of doing the SQL ceiling's and the
	// broker ceiling's work on the same CPUs: 1 / (1/SQL + 1/broker);
	// RatioToCombined divides the run's events/s by it.
	CombinedCeilingEventsPerSec float64 `json:"combined_ceiling_events_per_s,omitempty"`
	RatioToCombined             float64 `json:"ratio_to_combined,omitempty"`
	// RelayCPUPerEventUs is the relays' process CPU time (user + system, over
	// their whole lives: start-up and the wait for the backlog included) per event
	// drained, in µs.
	RelayCPUPerEventUs float64    `json:"relay_cpu_us_per_event,omitempty"`
	Published          int64      `json:"published"`
	BrokerMessages     int64      `json:"broker_messages"` // distinct events on the NATS stream; -1 when not observable
	RelayRSS           []RelayRSS `json:"relay_rss"`
	MaxRSSMiB          float64    `json:"max_rss_mib"`
	Series             []Sample   `json:"series"`
}

// Sample is the published count at T seconds after the backlog was committed.
type Sample struct {
	T         float64 `json:"t"`
	Published int64   `json:"published"`
}

const drainMethod = "The backlog is written by one INSERT … SELECT generate_series (plus the " +
	"matching outbox_aggregate_sequences rows and an ANALYZE) in one transaction while the " +
	"relays already run; its commit starts the clock (the relays are woken by its NOTIFY). " +
	"The drain ends at the largest published_at (server clock), so the harness's completion check (a NOT EXISTS probe of the partial index every 100 ms) does not " +
	"round the time, and the throughput series is computed from published_at after the run (200 ms " +
	"buckets), so that measuring costs the database next to nothing. After each " +
	"run every event must be published, and for NATS the stream must hold every event id. " +
	"CDC rows: one relay with --source cdc on a slot and publication of the run's own, started " +
	"(and streaming: its slot active) before the backlog is committed, so the backlog reaches it " +
	"through the stream; the slot and publication are dropped (pgoutbox cdc disable) after the run. " +
	"Broker ceiling (NATS only): just before each run, the same number of messages of the same " +
	"payload size, each with its own Nats-Msg-Id, published to the stream alone by as many " +
	"publishers (connections) as relays, each in batches of the batch size (published " +
	"asynchronously, then the batch's acks awaited), with no database. The combined ceiling is " +
	"the rate of doing both ceilings' work on the same CPUs, 1 / (1/SQL + 1/broker), and " +
	"× combined divides the run's events/s by it."

// ceilingVariants are the candidates for the cheapest statement that marks a batch
// of unpublished rows published with SKIP LOCKED. The fastest one is the ceiling:
// the plain LIMIT lets the planner scan the heap; the ordered one walks the partial
// index of unpublished rows.
var ceilingVariants = []struct{ name, sql string }{
	{"limit", `UPDATE %[1]s SET published_at = now()
 WHERE event_id IN (SELECT event_id FROM %[1]s WHERE published_at IS NULL LIMIT $1 FOR UPDATE SKIP LOCKED)`},
	{"index-order", `UPDATE %[1]s SET published_at = now()
 WHERE event_id IN (SELECT event_id FROM %[1]s WHERE published_at IS NULL
                     ORDER BY aggregate_type, aggregate_id, aggregate_sequence LIMIT $1 FOR UPDATE SKIP LOCKED)`},
}

func (r *Runner) drain(ctx context.Context) (*DrainResult, error) {
	c := r.cfg
	s, err := r.newSchema(ctx, "drain")
	if err != nil {
		return nil, err
	}
	defer r.dropSchema(s)
	res := &DrainResult{Events: c.Events, Aggregates: c.Aggregates, PayloadBytes: c.PayloadBytes, BatchSize: c.BatchSize,
		Method: drainMethod}

	// Both ceiling variants first; the faster one is then re-timed before every
	// relay run and once after the last, and each run is compared with the mean of
	// the ceilings just before and after it, so that a drift of the machine's speed
	// (other load, thermal, noisy neighbours) cancels out of the ratio.
	best, bestEPS := "", 0.0
	for _, v := range ceilingVariants {
		cr, err := r.ceiling(ctx, s, v.name, v.sql)
		if err != nil {
			return res, err
		}
		res.Ceiling = append(res.Ceiling, *cr)
		if cr.EventsPerSec > bestEPS {
			best, bestEPS, res.CeilingSQL = v.name, cr.EventsPerSec, fmt.Sprintf(v.sql, "outbox_events")
		}
	}
	bestSQL := ""
	for _, v := range ceilingVariants {
		if v.name == best {
			bestSQL = v.sql
		}
	}
	prev := bestEPS
	var pending []int // runs waiting for the ceiling after them
	settle := func(next float64) {
		for _, i := range pending {
			res.Runs[i].CeilingEventsPerSec = round2((prev + next) / 2)
			res.Runs[i].RatioToCeiling = ratio(res.Runs[i].EventsPerSec, res.Runs[i].CeilingEventsPerSec)
			if bc := res.Runs[i].BrokerCeilingEventsPerSec; bc > 0 {
				res.Runs[i].CombinedCeilingEventsPerSec = combinedCeiling(res.Runs[i].CeilingEventsPerSec, bc)
				res.Runs[i].RatioToCombined = ratio(res.Runs[i].EventsPerSec, res.Runs[i].CombinedCeilingEventsPerSec)
			}
		}
		pending, prev = pending[:0], next
	}
	for _, bc := range c.Brokers {
		b, err := r.broker(ctx, bc)
		if err != nil {
			return res, err
		}
		type cell struct {
			source string
			n      int
		}
		var cells []cell
		if r.hasSource(SourcePoll) {
			for _, n := range c.Relays {
				cells = append(cells, cell{SourcePoll, n})
			}
		}
		if r.hasSource(SourceCDC) {
			cells = append(cells, cell{SourceCDC, 1}) // one CDC source per schema
		}
		for k, cl := range cells {
			n := cl.n
			if len(res.Runs) > 0 || k > 0 {
				cr, err := r.ceiling(ctx, s, best, bestSQL)
				if err != nil {
					return res, err
				}
				res.Ceiling = append(res.Ceiling, *cr)
				settle(cr.EventsPerSec)
			}
			bceil, timed, err := r.brokerCeiling(ctx, b, n)
			if err != nil {
				return res, err
			}
			run, err := r.drainOnce(ctx, s, b, n, cl.source)
			if err != nil {
				return res, fmt.Errorf("%d %s relay(s) to %s: %w", n, cl.source, b.name, err)
			}
			if timed {
				run.BrokerCeilingEventsPerSec = bceil
			}
			res.Runs = append(res.Runs, *run)
			pending = append(pending, len(res.Runs)-1)
		}
	}
	cr, err := r.ceiling(ctx, s, best, bestSQL)
	if err != nil {
		return res, err
	}
	res.Ceiling = append(res.Ceiling, *cr)
	settle(cr.EventsPerSec)
	var xs []float64
	for _, cr := range res.Ceiling {
		if cr.Variant == best {
			xs = append(xs, cr.EventsPerSec)
		}
	}
	res.CeilingEventsPerSec = round2(median(xs))
	return res, nil
}

// ceiling times one variant on a freshly loaded backlog, from one connection.
func (r *Runner) ceiling(ctx context.Context, s *outboxSchema, name, sql string) (*CeilingRun, error) {
	c := r.cfg
	if err := r.truncate(ctx, s); err != nil {
		return nil, err
	}
	r.prog.step("drain: loading %d events for the SQL ceiling (%s)", c.Events, name)
	if _, err := r.loadBacklog(ctx, s, c.Events, c.Aggregates, c.PayloadBytes, "a", false); err != nil {
		return nil, err
	}
	conn, err := r.admin.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	q := fmt.Sprintf(sql, s.events)
	start := time.Now()
	var done int64
	stmts := 0
	for {
		tag, err := conn.Exec(ctx, q, c.BatchSize)
		if err != nil {
			return nil, fmt.Errorf("ceiling %s: %w", name, err)
		}
		stmts++
		if tag.RowsAffected() == 0 {
			break
		}
		done += tag.RowsAffected()
		r.prog.update("drain: SQL ceiling (%s) %d/%d events, %.0f/s", name, done, c.Events, float64(done)/time.Since(start).Seconds())
	}
	el := time.Since(start)
	if done != int64(c.Events) {
		return nil, fmt.Errorf("ceiling %s marked %d events, want %d", name, done, c.Events)
	}
	return &CeilingRun{Variant: name, Seconds: round3(el.Seconds()), EventsPerSec: round2(float64(done) / el.Seconds()), Statements: stmts}, nil
}

// drainOnce starts n relays of source on an empty outbox, commits the backlog and
// waits until every event is published.
func (r *Runner) drainOnce(ctx context.Context, s *outboxSchema, b *brokerEnv, n int, source string) (*DrainRun, error) {
	c := r.cfg
	if err := r.truncate(ctx, s); err != nil {
		return nil, err
	}
	if err := b.reset(ctx); err != nil {
		return nil, err
	}
	run := &DrainRun{Source: source, Broker: b.name, Relays: n, BrokerMessages: -1}
	label := fmt.Sprintf("%d relay(s)", n)
	o := relayOpts{schema: s.name, broker: b}
	var procs []*relayProc
	if source == SourceCDC {
		label = "CDC relay"
		o.cdcSlot = newCDCSlot(s.name)
		run.CDCSlot = o.cdcSlot
		defer r.cleanupCDC(&procs, s.name, o.cdcSlot) // registered before the relay may create the slot
	}
	r.prog.step("drain: starting %s → %s", label, b.name)
	procs, err := r.startRelays(ctx, n, o)
	if err != nil {
		return nil, err
	}
	defer stopRelays(procs)
	if source == SourceCDC {
		if err := r.waitSlotActive(ctx, o.cdcSlot, procs); err != nil {
			return nil, err
		}
	}
	r.prog.step("drain: loading %d events", c.Events)
	t0, err := r.loadBacklog(ctx, s, c.Events, c.Aggregates, c.PayloadBytes, "a", false)
	if err != nil {
		return nil, err
	}
	// The published count (a scan of the partial index) is read only for the
	// progress display, every 2s; the throughput series is computed from
	// published_at after the run.
	var shown time.Time
	err = r.waitPublished(ctx, s, procs, max(5*time.Minute, time.Duration(c.Events/200)*time.Second), func(el time.Duration) error {
		if time.Since(shown) < 2*time.Second {
			return nil
		}
		shown = time.Now()
		left, err := s.count(ctx, r.admin, "published_at IS NULL")
		if err != nil {
			return fmt.Errorf("count unpublished: %w", err)
		}
		r.prog.update("drain: %s → %s: %d/%d published, %.0f events/s", label, b.name,
			int64(c.Events)-left, c.Events, float64(int64(c.Events)-left)/el.Seconds())
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := stopRelays(procs); err != nil {
		return nil, err
	}
	run.RelayRSS = rssOf(procs)
	run.MaxRSSMiB = maxRSSMiB(run.RelayRSS)
	var cpu time.Duration
	for _, p := range procs {
		cpu += p.cpu()
	}
	run.RelayCPUPerEventUs = round2(float64(cpu.Microseconds()) / float64(c.Events))
	var end time.Time
	if err := r.admin.QueryRow(ctx, "SELECT max(published_at) FROM "+s.events).Scan(&end); err != nil {
		return nil, fmt.Errorf("last publish: %w", err)
	}
	el := end.Sub(t0)
	if el <= 0 {
		el = time.Millisecond
	}
	run.Seconds = round3(el.Seconds())
	run.EventsPerSec = round2(float64(c.Events) / el.Seconds())
	if run.Series, err = publishedSeries(ctx, r.admin, s, t0); err != nil {
		return nil, err
	}
	// The run counts only if nothing was lost.
	pub, err := s.count(ctx, r.admin, "published_at IS NOT NULL")
	if err != nil {
		return nil, err
	}
	run.Published = pub
	if pub != int64(c.Events) {
		return nil, fmt.Errorf("%d of %d events published", pub, c.Events)
	}
	if b.isNATS() {
		m, err := b.messages(ctx)
		if err != nil {
			return nil, err
		}
		run.BrokerMessages = int64(m)
		if m != uint64(c.Events) {
			return nil, fmt.Errorf("stream %s holds %d distinct events, want %d", b.stream, m, c.Events)
		}
	}
	return run, nil
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func round3(f float64) float64 { return float64(int64(f*1000+0.5)) / 1000 }

// seriesStep is the width of the throughput series' buckets.
const seriesStep = 0.2 // seconds

// publishedSeries reads, after a drain, how many events had been published
// seriesStep, 2·seriesStep, ... seconds after t0 (the backlog's commit), from
// published_at.
func publishedSeries(ctx context.Context, q *pgxpool.Pool, s *outboxSchema, t0 time.Time) ([]Sample, error) {
	rows, err := q.Query(ctx, `
SELECT b, sum(n) OVER (ORDER BY b)::bigint
  FROM (SELECT greatest(floor(extract(epoch FROM published_at - $1::timestamptz) / $2), 0)::int AS b, count(*) AS n
          FROM `+s.events+` WHERE published_at IS NOT NULL GROUP BY 1) x
 ORDER BY b`, t0, seriesStep)
	if err != nil {
		return nil, fmt.Errorf("throughput series: %w", err)
	}
	var out []Sample
	var b int
	var published int64
	_, err = pgx.ForEachRow(rows, []any{&b, &published}, func() error {
		out = append(out, Sample{T: round3(float64(b+1) * seriesStep), Published: published})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("throughput series: %w", err)
	}
	return out, nil
}

// waitPublished samples procs every 100ms until no event of s is left
// unpublished, and fails once limit has passed, naming what is left and the
// relays' last lines. Completion is a NOT EXISTS probe of the partial index:
// the harness must not load the database it measures. progress, when set,
// runs after each probe that found events left, with the time waited so far.
func (r *Runner) waitPublished(ctx context.Context, s *outboxSchema, procs []*relayProc, limit time.Duration, progress func(elapsed time.Duration) error) error {
	start := time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := sampleOnTick(ctx, tick.C, procs); err != nil {
			return err
		}
		var done bool
		if err := r.admin.QueryRow(ctx, "SELECT NOT EXISTS (SELECT 1 FROM "+s.events+" WHERE published_at IS NULL)").Scan(&done); err != nil {
			return fmt.Errorf("check unpublished: %w", err)
		}
		if done {
			return nil
		}
		el := time.Since(start)
		if progress != nil {
			if err := progress(el); err != nil {
				return err
			}
		}
		if el > limit {
			left, _ := s.count(ctx, r.admin, "published_at IS NULL")
			return fmt.Errorf("%d events still unpublished after %s; the relays' last lines: %s", left, el.Round(time.Second), tails(procs))
		}
	}
}
