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
	"github.com/pgoutbox/pgoutbox/wire"
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
	"whether or not earlier commits were slow. Before the clock starts, every producer connection " +
	"commits one event of another aggregate type and the relay publishes them all, so the run " +
	"starts warm. One relay publishes to NATS JetStream; an " +
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

// latencyOnce measures one mode (notify, poll or cdc) in a schema of its own:
// subscribe, start the relay, offer the rate on an open-loop schedule, wait
// for every event to arrive, and fold the latencies into a run.
func (r *Runner) latencyOnce(ctx context.Context, b *brokerEnv, mode string) (*LatencyRun, error) {
	s, err := r.newSchema(ctx, "latency")
	if err != nil {
		return nil, err
	}
	defer r.dropSchema(s)
	if err := b.reset(ctx); err != nil {
		return nil, err
	}
	p, err := r.newLatencyProbe(s, b, mode)
	if err != nil {
		return nil, err
	}
	// Subscribe before anything is published.
	cc, err := p.subscribe(ctx)
	if err != nil {
		return nil, err
	}
	defer cc.Stop()

	r.prog.step("latency (%s): starting a relay", mode)
	if p.isCDC {
		p.o.cdcSlot = newCDCSlot(s.name)
		defer r.cleanupCDC(&p.procs, s.name, p.o.cdcSlot) // registered before the relay may create the slot
	}
	if p.procs, err = r.startRelays(ctx, 1, p.o); err != nil {
		return nil, err
	}
	defer stopRelays(p.procs)
	if p.isCDC {
		if err := r.waitSlotActive(ctx, p.o.cdcSlot, p.procs); err != nil {
			return nil, err
		}
	}

	// Enough connections that slow commits (fsync on a busy disk) do not cap the
	// offered rate: about 40 ms of commits in flight at the rate asked.
	p.producers = min(64, max(8, r.cfg.Rate/25))
	if p.pool, err = r.producerPool(ctx, p.producers, !p.poll && !p.isCDC); err != nil {
		return nil, err
	}
	defer p.pool.Close()
	if err := r.warmUp(ctx, b, p.procs, p.pool, p.producers, []*pgoutbox.Producer{p.prod}, p.payload); err != nil {
		return nil, err
	}
	produced, err := p.offer(ctx)
	if err != nil {
		return nil, err
	}
	if err := p.awaitAll(ctx); err != nil {
		return nil, err
	}
	if err := stopRelays(p.procs); err != nil {
		return nil, err
	}
	return p.result(produced), nil
}

// latencyProbe is one latency run: the events it offers, when each committed
// and when each was seen on the stream.
type latencyProbe struct {
	r           *Runner
	b           *brokerEnv
	mode        string
	label       string  // names the run in progress lines
	rate        float64 // offered events/s
	poll, isCDC bool
	o           relayOpts
	procs       []*relayProc
	producers   int
	pool        *pgxpool.Pool
	prod        *pgoutbox.Producer
	// prods, when set, are the producers of several outboxes: event i goes
	// to prods[i % len(prods)] (tenants' fairness run).
	prods []*pgoutbox.Producer
	// filter, when set, is the only subject the subscriber reads.
	filter  string
	payload map[string]any

	n         int
	ids       []pgoutbox.UUID
	index     map[pgoutbox.UUID]int
	committed []atomic.Int64 // unix ns when COMMIT returned
	seen      []atomic.Int64 // unix ns when the subscriber got it
	received  atomic.Int64
	lagMax    atomic.Int64 // ns: the worst commit behind its schedule
}

// newLatencyProbe makes the run's event ids, its producer and its payload.
func (r *Runner) newLatencyProbe(s *outboxSchema, b *brokerEnv, mode string) (*latencyProbe, error) {
	c := r.cfg
	n := max(1, int(float64(c.Rate)*c.Duration.Seconds()))
	p := &latencyProbe{r: r, b: b, mode: mode, label: "latency (" + mode + ")", rate: float64(c.Rate),
		poll: mode == "poll", isCDC: mode == SourceCDC, n: n,
		ids: make([]pgoutbox.UUID, n), index: make(map[pgoutbox.UUID]int, n),
		committed: make([]atomic.Int64, n), seen: make([]atomic.Int64, n)}
	p.o = relayOpts{schema: s.name, broker: b, noNotify: p.poll}
	for i := range p.ids {
		p.ids[i] = pgoutbox.NewEventID()
		p.index[p.ids[i]] = i
	}
	var err error
	if p.prod, err = pgoutbox.NewProducer(&pgoutbox.Config{Schema: s.name}); err != nil {
		return nil, err
	}
	pad := make([]byte, max(0, c.PayloadBytes-40))
	for i := range pad {
		pad[i] = 'x'
	}
	p.payload = map[string]any{"pad": string(pad)}
	return p, nil
}

// subscribe records when each of the run's events arrives on the stream.
func (p *latencyProbe) subscribe(ctx context.Context) (jetstream.ConsumeContext, error) {
	stream, err := p.b.js.Stream(ctx, p.b.stream)
	if err != nil {
		return nil, fmt.Errorf("stream: %w", err)
	}
	var occ jetstream.OrderedConsumerConfig
	if p.filter != "" {
		occ.FilterSubjects = []string{p.filter}
	}
	cons, err := stream.OrderedConsumer(ctx, occ)
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		now := time.Now().UnixNano()
		id, err := pgoutbox.ParseUUID(m.Headers().Get(wire.HeaderEventID))
		if err != nil {
			return
		}
		if i, ok := p.index[id]; ok && p.seen[i].CompareAndSwap(0, now) {
			p.received.Add(1)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("consume: %w", err)
	}
	return cc, nil
}

// warmUp makes a latency run start warm: every connection of pool (each a
// PostgreSQL backend of its own, whose first enqueue loads the catalog and
// prepares and plans the statement) commits one event per producer in prods,
// of aggregate type "warmup", and the relays publish them all before the clock
// starts; the runs do not measure them. The connections are all acquired
// (acquireAll) before any commits.
func (r *Runner) warmUp(ctx context.Context, b *brokerEnv, procs []*relayProc, pool *pgxpool.Pool, conns int,
	prods []*pgoutbox.Producer, payload map[string]any) error {
	held, release, err := acquireAll(ctx, pool, conns)
	defer release()
	if err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	errs := make([]error, conns)
	var wg sync.WaitGroup
	for w, conn := range held {
		wg.Go(func() {
			for _, p := range prods {
				if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
					_, err := p.EnqueueTx(ctx, tx, pgoutbox.Event{AggregateType: "warmup", AggregateID: strconv.Itoa(w), EventType: "warm", Payload: payload})
					return err
				}); err != nil {
					errs[w] = fmt.Errorf("warm-up: %w", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// The broker's stream was emptied before: it holds the warm-up events alone.
	warm := uint64(conns * len(prods))
	deadline := time.Now().Add(30*time.Second + 3*r.cfg.PollInterval)
	for {
		m, err := b.messages(ctx)
		if err != nil {
			return err
		}
		if m >= warm {
			return nil
		}
		if err := sampleAll(procs); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("warm-up: %d of %d events published in time: %s", m, warm, tails(procs))
		}
		r.prog.update("warm-up: %d/%d events published", m, warm)
		if !sleepCtx(ctx, 20*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// offer commits the run's events on the open-loop schedule (event i due at
// start + i/rate) and returns how long that took.
func (p *latencyProbe) offer(ctx context.Context) (time.Duration, error) {
	p.r.prog.step("%s: offering %g events/s for %s", p.label, p.rate, time.Duration(float64(p.n)/p.rate*float64(time.Second)).Round(time.Millisecond))
	due := make(chan int, p.n)
	period := time.Duration(float64(time.Second) / p.rate)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, p.producers)
	for w := range p.producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range due {
				if errs[w] != nil {
					continue // drain the schedule
				}
				errs[w] = p.commit(ctx, i, start.Add(time.Duration(i)*period))
			}
		}()
	}
	for i := range p.n {
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
			_ = sampleAll(p.procs)
			p.r.prog.update("%s: %d/%d committed-or-due, %d seen", p.label, i, p.n, p.received.Load())
		}
	}
	close(due)
	wg.Wait()
	produced := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return 0, fmt.Errorf("producer: %w", err)
	}
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	return produced, nil
}

// commit commits event i, which was due at due, and records when the commit
// returned and how late it was.
func (p *latencyProbe) commit(ctx context.Context, i int, due time.Time) error {
	prod := p.prod
	if len(p.prods) > 0 {
		prod = p.prods[i%len(p.prods)]
	}
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		_, err := prod.EnqueueTx(ctx, tx, pgoutbox.Event{ID: p.ids[i], AggregateType: "order",
			AggregateID: strconv.Itoa(i % 1000), EventType: "order.placed", Payload: p.payload})
		return err
	})
	now := time.Now()
	p.committed[i].Store(now.UnixNano())
	lag := int64(now.Sub(due))
	for old := p.lagMax.Load(); lag > old && !p.lagMax.CompareAndSwap(old, lag); old = p.lagMax.Load() {
	}
	return err
}

// awaitAll waits until every event was seen on the stream (at most 30s plus
// three poll intervals), sampling the relay meanwhile.
func (p *latencyProbe) awaitAll(ctx context.Context) error {
	deadline := time.Now().Add(30*time.Second + 3*p.r.cfg.PollInterval)
	for p.received.Load() < int64(p.n) {
		if err := sampleAll(p.procs); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d events reached the subscriber", p.received.Load(), p.n)
		}
		p.r.prog.update("%s: waiting for the last events: %d/%d seen", p.label, p.received.Load(), p.n)
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// result folds the latencies (arrival − commit) into the run's distribution.
func (p *latencyProbe) result(produced time.Duration) *LatencyRun {
	c := p.r.cfg
	h, early := p.histogram(nil)
	ms := func(q float64) float64 { return round3(float64(h.ValueAtQuantile(q)) / 1000) }
	source := SourcePoll
	if p.isCDC {
		source = SourceCDC
	}
	run := &LatencyRun{Source: source, CDCSlot: p.o.cdcSlot, Mode: p.mode, PollIntervalS: c.PollInterval.Seconds(), OfferedRate: c.Rate, Offered: p.n,
		Received: int(p.received.Load()), Early: early, AchievedRate: round2(float64(p.n) / produced.Seconds()),
		P50Ms: ms(50), P90Ms: ms(90), P99Ms: ms(99), P999Ms: ms(99.9), MaxMs: round3(float64(h.Max()) / 1000),
		MeanMs: round3(h.Mean() / 1000), MaxScheduleLagMs: round3(float64(p.lagMax.Load()) / 1e6)}
	for _, q := range []float64{0, 10, 25, 50, 75, 90, 95, 99, 99.5, 99.9, 99.99, 100} {
		run.Percentiles = append(run.Percentiles, Percentile{Percentile: q, Ms: ms(q)})
	}
	run.Histogram = logBuckets(h)
	run.RelayRSS = rssOf(p.procs)
	run.MaxRSSMiB = maxRSSMiB(run.RelayRSS)
	return run
}

// histogram folds the latencies (arrival − commit, µs) of the events keep
// accepts (nil: all) into a histogram; early counts those seen before their
// commit returned, recorded as 0.
func (p *latencyProbe) histogram(keep func(i int) bool) (h *hdrhistogram.Histogram, early int) {
	h = hdrhistogram.New(1, 600_000_000, 3) // µs, up to 10 min
	for i := range p.n {
		if keep != nil && !keep(i) {
			continue
		}
		d := p.seen[i].Load() - p.committed[i].Load()
		if d < 0 {
			early++
			d = 0
		}
		_ = h.RecordValue(max(1, d/1000))
	}
	return h, early
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
