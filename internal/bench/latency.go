package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
)

// LatencyResult is the latency scenario: commit → seen on the stream, at a fixed
// offered rate, with NOTIFY wake-up and with polling only.
type LatencyResult struct {
	Method string       `json:"method"`
	Broker string       `json:"broker"`
	Runs   []LatencyRun `json:"runs"`
}

// LatencyRun is one mode's distribution, in milliseconds.
type LatencyRun struct {
	// Source is the relay's source: poll (modes notify and poll) or cdc (mode cdc).
	// Empty in JSON of older runs: poll.
	Source string `json:"source,omitempty"`
	// CDCSlot is the slot (and publication) a cdc run created and dropped.
	CDCSlot       string  `json:"cdc_slot,omitempty"`
	Mode          string  `json:"mode"` // notify, poll or cdc
	PollIntervalS float64 `json:"poll_interval_s"`
	OfferedRate   int     `json:"offered_rate"`
	AchievedRate  float64 `json:"achieved_rate"` // commits/s actually completed
	Offered       int     `json:"offered"`
	Received      int     `json:"received"`
	Early         int     `json:"early"` // seen before the producer's commit returned (counted as 0 ms)
	P50Ms         float64 `json:"p50_ms"`
	P90Ms         float64 `json:"p90_ms"`
	P99Ms         float64 `json:"p99_ms"`
	P999Ms        float64 `json:"p999_ms"`
	MaxMs         float64 `json:"max_ms"`
	MeanMs        float64 `json:"mean_ms"`
	// MaxScheduleLagMs is the worst delay of a commit behind its schedule: when it
	// is large the producers could not offer the rate.
	MaxScheduleLagMs float64      `json:"max_schedule_lag_ms"`
	Percentiles      []Percentile `json:"percentiles"`
	Histogram        []Bucket     `json:"histogram"`
	RelayRSS         []RelayRSS   `json:"relay_rss"`
	MaxRSSMiB        float64      `json:"max_rss_mib"`
}

// Percentile is one point of the latency distribution.
type Percentile struct {
	Percentile float64 `json:"percentile"`
	Ms         float64 `json:"ms"`
}

// Bucket counts latencies in (previous UpToMs, UpToMs].
type Bucket struct {
	UpToMs float64 `json:"up_to_ms"`
	Count  int64   `json:"count"`
}

const latencyMethod = "Producers (rate/25 connections, 8..64) commit single-event transactions (BEGIN; " +
	"Producer.EnqueueTx; COMMIT) on an open-loop schedule: event i is due at start + i/rate, " +
	"whether or not earlier commits were slow. One relay publishes to NATS JetStream; an " +
	"ordered JetStream consumer on the stream (so a message is seen only after the stream " +
	"stored it) records when each event id arrives. Latency = arrival − the instant the " +
	"producer's COMMIT returned, on one clock: an upper bound of commit → broker ack. Polling " +
	"only: the relay runs with --no-notify and the producers with pgoutbox.notify = 'off'. CDC: " +
	"the relay runs with --source cdc (a slot and publication of the run's own, streaming " +
	"before the first commit, dropped after) and the producers with pgoutbox.notify = 'off' " +
	"(nobody listens)."

func (r *Runner) latency(ctx context.Context) (*LatencyResult, error) {
	b, err := r.natsBroker(ctx)
	if err != nil {
		return nil, err
	}
	res := &LatencyResult{Method: latencyMethod, Broker: b.name}
	var modes []string
	if r.hasSource(SourcePoll) {
		modes = append(modes, "notify", "poll")
	}
	if r.hasSource(SourceCDC) {
		modes = append(modes, SourceCDC)
	}
	for _, mode := range modes {
		run, err := r.latencyOnce(ctx, b, mode)
		if err != nil {
			return res, fmt.Errorf("%s: %w", mode, err)
		}
		res.Runs = append(res.Runs, *run)
	}
	return res, nil
}

func (r *Runner) latencyOnce(ctx context.Context, b *brokerEnv, mode string) (*LatencyRun, error) {
	c := r.cfg
	s, err := r.newSchema(ctx, "latency")
	if err != nil {
		return nil, err
	}
	defer r.dropSchema(s)
	if err := b.reset(ctx); err != nil {
		return nil, err
	}
	poll, isCDC := mode == "poll", mode == SourceCDC
	n := max(1, int(float64(c.Rate)*c.Duration.Seconds()))
	ids := make([]pgoutbox.UUID, n)
	index := make(map[pgoutbox.UUID]int, n)
	for i := range ids {
		ids[i] = pgoutbox.NewEventID()
		index[ids[i]] = i
	}
	committed := make([]atomic.Int64, n) // unix ns when COMMIT returned
	seen := make([]atomic.Int64, n)      // unix ns when the subscriber got it
	var received atomic.Int64

	// Subscribe before anything is published.
	stream, err := b.js.Stream(ctx, b.stream)
	if err != nil {
		return nil, fmt.Errorf("stream: %w", err)
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		now := time.Now().UnixNano()
		id, err := pgoutbox.ParseUUID(m.Headers().Get(broker.HeaderEventID))
		if err != nil {
			return
		}
		if i, ok := index[id]; ok && seen[i].CompareAndSwap(0, now) {
			received.Add(1)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("consume: %w", err)
	}
	defer cc.Stop()

	r.prog.step("latency (%s): starting a relay", mode)
	o := relayOpts{schema: s.name, broker: b, noNotify: poll}
	var procs []*relayProc
	if isCDC {
		o.cdcSlot = newCDCSlot(s.name)
		defer r.cleanupCDC(&procs, s.name, o.cdcSlot) // registered before the relay may create the slot
	}
	procs, err = r.startRelays(ctx, 1, o)
	if err != nil {
		return nil, err
	}
	defer stopRelays(procs)
	if isCDC {
		if err := r.waitSlotActive(ctx, o.cdcSlot, procs); err != nil {
			return nil, err
		}
	}

	// Enough connections that slow commits (fsync on a busy disk) do not cap the
	// offered rate: about 40 ms of commits in flight at the rate asked.
	producers := min(64, max(8, c.Rate/25))
	pc, err := pgxpool.ParseConfig(c.DatabaseURL)
	if err != nil {
		return nil, err
	}
	pc.MaxConns, pc.MinConns = int32(producers), int32(producers)
	if poll || isCDC {
		pc.ConnConfig.RuntimeParams["pgoutbox.notify"] = "off"
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect producers: %w", err)
	}
	defer pool.Close()
	prod, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: s.name})
	if err != nil {
		return nil, err
	}
	pad := make([]byte, max(0, c.PayloadBytes-40))
	for i := range pad {
		pad[i] = 'x'
	}
	payload := map[string]any{"pad": string(pad)}
	// Warm the connections (their statement caches) on another aggregate type; those
	// events are published too but not measured.
	for i := range producers {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := prod.EnqueueTx(ctx, tx, pgoutbox.Event{AggregateType: "warmup", AggregateID: strconv.Itoa(i), EventType: "warm", Payload: payload})
			return err
		}); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}

	r.prog.step("latency (%s): offering %d events/s for %s", mode, c.Rate, c.Duration)
	due := make(chan int, n)
	period := time.Second / time.Duration(c.Rate)
	start := time.Now()
	var lagMax atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, producers)
	for w := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range due {
				if errs[w] != nil {
					continue // drain the schedule
				}
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := prod.EnqueueTx(ctx, tx, pgoutbox.Event{ID: ids[i], AggregateType: "order",
						AggregateID: strconv.Itoa(i % 1000), EventType: "order.placed", Payload: payload})
					return err
				})
				now := time.Now()
				committed[i].Store(now.UnixNano())
				lag := int64(now.Sub(start.Add(time.Duration(i) * period)))
				for old := lagMax.Load(); lag > old && !lagMax.CompareAndSwap(old, lag); old = lagMax.Load() {
				}
				errs[w] = err
			}
		}()
	}
	// The schedule: event i is due at start + i·period, open loop.
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * period)); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			break
		}
		due <- i
		if i%50 == 0 {
			_ = sampleAll(procs)
			r.prog.update("latency (%s): %d/%d committed-or-due, %d seen", mode, i, n, received.Load())
		}
	}
	close(due)
	wg.Wait()
	produced := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("producer: %w", err)
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	deadline := time.Now().Add(30*time.Second + 3*c.PollInterval)
	for received.Load() < int64(n) {
		if err := sampleAll(procs); err != nil {
			return nil, err
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("only %d of %d events reached the subscriber", received.Load(), n)
		}
		r.prog.update("latency (%s): waiting for the last events: %d/%d seen", mode, received.Load(), n)
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if err := stopRelays(procs); err != nil {
		return nil, err
	}
	h := hdrhistogram.New(1, 600_000_000, 3) // µs, up to 10 min
	early := 0
	for i := range n {
		d := seen[i].Load() - committed[i].Load()
		if d < 0 {
			early++
			d = 0
		}
		_ = h.RecordValue(max(1, d/1000))
	}
	ms := func(q float64) float64 { return round3(float64(h.ValueAtQuantile(q)) / 1000) }
	source := SourcePoll
	if isCDC {
		source = SourceCDC
	}
	run := &LatencyRun{Source: source, CDCSlot: o.cdcSlot, Mode: mode, PollIntervalS: c.PollInterval.Seconds(), OfferedRate: c.Rate, Offered: n,
		Received: int(received.Load()), Early: early, AchievedRate: round2(float64(n) / produced.Seconds()),
		P50Ms: ms(50), P90Ms: ms(90), P99Ms: ms(99), P999Ms: ms(99.9), MaxMs: round3(float64(h.Max()) / 1000),
		MeanMs: round3(h.Mean() / 1000), MaxScheduleLagMs: round3(float64(lagMax.Load()) / 1e6)}
	for _, q := range []float64{0, 10, 25, 50, 75, 90, 95, 99, 99.5, 99.9, 99.99, 100} {
		run.Percentiles = append(run.Percentiles, Percentile{Percentile: q, Ms: ms(q)})
	}
	run.Histogram = logBuckets(h)
	run.RelayRSS = rssOf(procs)
	run.MaxRSSMiB = maxRSSMiB(run.RelayRSS)
	return run, nil
}

// logBuckets folds an HDR histogram (µs) into power-of-two millisecond buckets
// from 0.25 ms up, enough to draw and to read.
func logBuckets(h *hdrhistogram.Histogram) []Bucket {
	var edges []float64
	for e := 0.25; ; e *= 2 {
		edges = append(edges, e)
		if e*1000 >= float64(h.Max()) {
			break
		}
	}
	out := make([]Bucket, len(edges))
	for i, e := range edges {
		out[i].UpToMs = e
	}
	for _, bar := range h.Distribution() {
		if bar.Count == 0 {
			continue
		}
		v := float64(bar.To) / 1000
		k := len(edges) - 1
		for i, e := range edges {
			if v <= e {
				k = i
				break
			}
		}
		out[k].Count += bar.Count
	}
	return out
}
