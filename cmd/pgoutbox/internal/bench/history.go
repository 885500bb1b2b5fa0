package bench

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/pgoutbox/pgoutbox"
)

// HistoryResult is the history scenario: does a large published history slow the
// relay's pick-up of fresh events?
type HistoryResult struct {
	Method      string         `json:"method"`
	HistoryRows int            `json:"history_rows"`
	Phases      []HistoryPhase `json:"phases"`
	// RatioP50 is the p50 pick-up time with the history over the p50 without.
	RatioP50 float64 `json:"ratio_p50"`
	// ClaimRatio is the same ratio for the claim statement's mean execution time
	// from pg_stat_statements (0 when unavailable).
	ClaimRatio float64 `json:"claim_ratio"`
}

// HistoryPhase is one table size.
type HistoryPhase struct {
	KeptRows   int     `json:"kept_rows"`
	LoadS      float64 `json:"load_s"` // generating the history, VACUUM ANALYZE included
	TableMiB   float64 `json:"table_mib"`
	Trials     int     `json:"trials"`
	Events     int     `json:"events"`
	P50Ms      float64 `json:"p50_ms"`
	P90Ms      float64 `json:"p90_ms"`
	MaxMs      float64 `json:"max_ms"`
	BatchP50Ms float64 `json:"batch_p50_ms"` // client side: commit returned → all of a batch seen published
	// ClaimMeanMs is the relay's claim statement's mean execution time
	// (pg_stat_statements; every call, empty polls included), 0 when unavailable.
	ClaimMeanMs float64    `json:"claim_mean_ms"`
	ClaimCalls  int64      `json:"claim_calls"`
	RelayRSS    []RelayRSS `json:"relay_rss"`
	MaxRSSMiB   float64    `json:"max_rss_mib"`
}

const historyTrialEvents = 10

const historyMethod = "Two phases, each in a fresh schema with its own relay (null broker, NOTIFY on): " +
	"an empty outbox, and one holding the published history (generate_series rows spread over " +
	"1,000 aggregates with published_at set and a ~30-byte payload, then VACUUM ANALYZE, as " +
	"autovacuum would leave a long-lived table). Each trial commits 10 fresh events (one per " +
	"aggregate, on aggregates that have history) in one autocommit INSERT and waits until all " +
	"are published; the two phases' trials alternate (after 3 warm-up trials each) so that " +
	"drift of the machine's speed hits both alike. Pick-up time per event = published_at − occurred_at, both from the " +
	"server's clock: from the producer's statement start (≈ its commit) to the start of the " +
	"relay's mark transaction, so it spans NOTIFY, claim, publish and no client clock. The " +
	"claim statement's own mean time is read from pg_stat_statements when available."

func (r *Runner) history(ctx context.Context) (*HistoryResult, error) {
	c := r.cfg
	res := &HistoryResult{Method: historyMethod, HistoryRows: c.HistoryRows}
	var phases []*historyPhase
	defer func() {
		for _, p := range phases {
			p.close(r)
		}
	}()
	for _, kept := range []int{0, c.HistoryRows} {
		p, err := r.newHistoryPhase(ctx, kept)
		if err != nil {
			return res, fmt.Errorf("%d kept rows: %w", kept, err)
		}
		phases = append(phases, p)
	}
	// Warm both relays, then alternate the phases' trials so that a drift of the
	// machine's speed affects both alike.
	for _, p := range phases {
		for range 3 {
			if err := r.historyTrial(ctx, p, -1); err != nil {
				return res, err
			}
		}
		p.claim0, _ = r.claimStats(ctx, p.schema.name)
	}
	for t := range c.HistoryTrials {
		for _, p := range phases {
			r.prog.update("history: trial %d/%d, %d kept rows", t+1, c.HistoryTrials, p.KeptRows)
			if err := r.historyTrial(ctx, p, t); err != nil {
				return res, fmt.Errorf("%d kept rows: %w", p.KeptRows, err)
			}
		}
	}
	for _, p := range phases {
		if err := p.finish(ctx, r); err != nil {
			return res, err
		}
		res.Phases = append(res.Phases, p.HistoryPhase)
	}
	res.RatioP50 = ratio(res.Phases[1].P50Ms, res.Phases[0].P50Ms)
	res.ClaimRatio = ratio(res.Phases[1].ClaimMeanMs, res.Phases[0].ClaimMeanMs)
	return res, nil
}

// historyPhase is one table size with its relay.
type historyPhase struct {
	HistoryPhase
	schema             *outboxSchema
	procs              []*relayProc
	prod               *pgoutbox.Producer
	claim0             claimStat
	perEvent, perBatch []float64
}

func (p *historyPhase) close(r *Runner) {
	_ = stopRelays(p.procs)
	r.dropSchema(p.schema)
}

const historyAggregates = 1000

func (r *Runner) newHistoryPhase(ctx context.Context, kept int) (*historyPhase, error) {
	c := r.cfg
	s, err := r.newSchema(ctx, "history")
	if err != nil {
		return nil, err
	}
	p := &historyPhase{HistoryPhase: HistoryPhase{KeptRows: kept, Trials: c.HistoryTrials}, schema: s}
	if kept > 0 {
		r.prog.step("history: generating %d published rows", kept)
		start := time.Now()
		stop := r.tickProgress(func() string {
			return fmt.Sprintf("history: generating %d published rows (%.0fs)", kept, time.Since(start).Seconds())
		})
		_, err := r.loadBacklog(ctx, s, kept, min(historyAggregates, kept), 0, "h", true)
		if err == nil {
			_, err = r.admin.Exec(ctx, "VACUUM (ANALYZE) "+s.events)
		}
		stop()
		if err != nil {
			r.dropSchema(s)
			return nil, fmt.Errorf("generate history: %w", err)
		}
		p.LoadS = round3(time.Since(start).Seconds())
	}
	var size int64
	if err := r.admin.QueryRow(ctx, "SELECT pg_total_relation_size($1::regclass)", s.events).Scan(&size); err == nil {
		p.TableMiB = round2(float64(size) / (1 << 20))
	}
	null, err := r.broker(ctx, "null")
	if err != nil {
		r.dropSchema(s)
		return nil, err
	}
	r.prog.step("history (%d kept rows): starting a relay", kept)
	if p.procs, err = r.startRelays(ctx, 1, relayOpts{schema: s.name, broker: null}); err != nil {
		r.dropSchema(s)
		return nil, err
	}
	if p.prod, err = pgoutbox.NewProducer(&pgoutbox.Config{Schema: s.name}); err != nil {
		p.close(r)
		return nil, err
	}
	return p, nil
}

// historyTrial commits a fresh batch and waits until the relay published it;
// t < 0 is a warm-up, not recorded.
func (r *Runner) historyTrial(ctx context.Context, p *historyPhase, t int) error {
	c := r.cfg
	evs := make([]pgoutbox.Event, historyTrialEvents)
	ids := make([]pgoutbox.UUID, len(evs))
	for i := range evs {
		ids[i] = pgoutbox.NewEventID()
		evs[i] = pgoutbox.Event{ID: ids[i], AggregateType: "bench",
			AggregateID: fmt.Sprintf("h%06d", (max(t, 0)*historyTrialEvents+i)%historyAggregates),
			EventType:   "bench.fresh", Payload: map[string]int{"trial": t}}
	}
	if _, err := p.prod.EnqueueTx(ctx, r.admin, evs...); err != nil {
		return fmt.Errorf("enqueue: %w", err)
	}
	committed := time.Now()
	deadline := committed.Add(30*time.Second + 2*c.PollInterval)
	for {
		var left int
		if err := r.admin.QueryRow(ctx, "SELECT count(*) FROM "+p.schema.events+" WHERE event_id = ANY($1) AND published_at IS NULL", ids).Scan(&left); err != nil {
			return err
		}
		if left == 0 {
			break
		}
		if err := sampleAll(p.procs); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("trial %d: %d events unpublished after 30s", t, left)
		}
		if !sleepCtx(ctx, 2*time.Millisecond) {
			return ctx.Err()
		}
	}
	if t < 0 {
		return nil
	}
	p.perBatch = append(p.perBatch, float64(time.Since(committed).Microseconds())/1000)
	rows, err := r.admin.Query(ctx, "SELECT extract(epoch FROM published_at - occurred_at)::float8 * 1000 FROM "+p.schema.events+" WHERE event_id = ANY($1)", ids)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var ms float64
		if err := rows.Scan(&ms); err != nil {
			return err
		}
		p.perEvent = append(p.perEvent, ms)
	}
	return rows.Err()
}

func (p *historyPhase) finish(ctx context.Context, r *Runner) error {
	claim1, ok := r.claimStats(ctx, p.schema.name)
	if ok && claim1.calls > p.claim0.calls {
		p.ClaimCalls = claim1.calls - p.claim0.calls
		p.ClaimMeanMs = round3((claim1.totalMs - p.claim0.totalMs) / float64(p.ClaimCalls))
	}
	if err := stopRelays(p.procs); err != nil {
		return err
	}
	slices.Sort(p.perEvent)
	p.Events = len(p.perEvent)
	p.P50Ms = round3(quantile(p.perEvent, 0.5))
	p.P90Ms = round3(quantile(p.perEvent, 0.9))
	p.MaxMs = round3(quantile(p.perEvent, 1))
	slices.Sort(p.perBatch)
	p.BatchP50Ms = round3(quantile(p.perBatch, 0.5))
	p.RelayRSS = rssOf(p.procs)
	p.MaxRSSMiB = maxRSSMiB(p.RelayRSS)
	return nil
}

type claimStat struct {
	calls   int64
	totalMs float64
}

// claimStats sums pg_stat_statements over the relay's claim statements of schema
// (the statements that lease rows: SET claimed_by = $1).
func (r *Runner) claimStats(ctx context.Context, schema string) (claimStat, bool) {
	var st claimStat
	err := r.admin.QueryRow(ctx, `SELECT coalesce(sum(calls), 0), coalesce(sum(total_exec_time), 0) FROM pg_stat_statements
 WHERE query LIKE '%' || $1 || '%' AND query LIKE '%SET claimed_by = $1%'`, schema).Scan(&st.calls, &st.totalMs)
	return st, err == nil
}

// quantile of sorted xs, nearest rank.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	i := int(q*float64(len(xs))+0.5) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}

// tickProgress redraws a progress line every second until stop is called.
func (r *Runner) tickProgress(line func() string) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				r.prog.update("%s", line())
			}
		}
	}()
	return func() { close(done); <-finished }
}
