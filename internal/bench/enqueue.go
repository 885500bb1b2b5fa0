package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
)

// EnqueueResult is the enqueue scenario: commits/s of a small business transaction
// without and with one outbox event, with NOTIFY on and off.
type EnqueueResult struct {
	Method    string        `json:"method"`
	DurationS float64       `json:"duration_s"`
	Cells     []EnqueueCell `json:"cells"`
	Ratios    EnqueueRatios `json:"ratios"`
	// RelayRSS is the relay of the "relay running" cells.
	RelayRSS  []RelayRSS `json:"relay_rss,omitempty"`
	MaxRSSMiB float64    `json:"max_rss_mib,omitempty"`
}

// EnqueueCell is one combination timed for DurationS.
type EnqueueCell struct {
	Producers int  `json:"producers"`
	Outbox    bool `json:"outbox"`
	// Batched: the event rode in the business INSERT's round trip
	// (Producer.QueueTx) instead of a statement of its own (EnqueueTx).
	Batched       bool    `json:"batched,omitempty"`
	Notify        bool    `json:"notify"`
	Relay         bool    `json:"relay"` // a relay (null broker) ran during the cell
	Commits       int64   `json:"commits"`
	Seconds       float64 `json:"seconds"`
	CommitsPerSec float64 `json:"commits_per_s"`
	P50Ms         float64 `json:"p50_ms"`
	P99Ms         float64 `json:"p99_ms"`
}

// EnqueueRatios compare cells. Time ratios are (time per commit with) / (without):
// 1.10 means the outbox makes the transaction 10% slower.
type EnqueueRatios struct {
	OutboxTimeRatio1  float64 `json:"outbox_time_ratio_1"`  // 1 producer, NOTIFY on, EnqueueTx
	OutboxTimeRatio16 float64 `json:"outbox_time_ratio_16"` // 16 producers, NOTIFY on, EnqueueTx
	// The same with QueueTx: the event in the business INSERT's round trip.
	BatchedTimeRatio1  float64 `json:"batched_time_ratio_1,omitempty"`
	BatchedTimeRatio16 float64 `json:"batched_time_ratio_16,omitempty"`
	// NotifyCost16 is the share of commits/s NOTIFY costs at 16 producers while a
	// relay runs (producers may notify only when a relay listens):
	// 1 − (NOTIFY on) / (NOTIFY off).
	NotifyCost16 float64 `json:"notify_cost_16"`
	// NotifyCost16NoRelay and NotifyCost1NoRelay are the same without a relay.
	NotifyCost16NoRelay float64 `json:"notify_cost_16_no_relay"`
	NotifyCost1NoRelay  float64 `json:"notify_cost_1_no_relay"`
}

const enqueueMethod = "Each producer loops BEGIN; INSERT one row into a business table (orders); " +
	"[Producer.EnqueueTx one event with a ~payload-bytes JSON payload;] COMMIT, on its own " +
	"connection, for the duration; the batched cells send the INSERT and the event's statement " +
	"(Producer.QueueTx) in one round trip, so the transaction has as many round trips as " +
	"without the outbox. NOTIFY off sets pgoutbox.notify = 'off' on the producers' " +
	"connections. The first eight cells run without a relay: the producers' cost alone. The " +
	"last two run 16 producers while one relay (null broker) drains the outbox, because " +
	"producers may notify only when a relay listens (or is idle); NOTIFY's cost is " +
	"taken from that pair."

func (r *Runner) enqueue(ctx context.Context) (*EnqueueResult, error) {
	c := r.cfg
	s, err := r.newSchema(ctx, "enqueue")
	if err != nil {
		return nil, err
	}
	defer r.dropSchema(s)
	orders := pgx.Identifier{s.name, "orders"}.Sanitize()
	if _, err := r.admin.Exec(ctx, "CREATE TABLE "+orders+" (id bigint PRIMARY KEY, customer text NOT NULL, total_cents int NOT NULL)"); err != nil {
		return nil, fmt.Errorf("create orders: %w", err)
	}
	prod, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: s.name})
	if err != nil {
		return nil, err
	}
	pools := map[bool]*pgxpool.Pool{}
	for _, notify := range []bool{true, false} {
		pc, err := pgxpool.ParseConfig(c.DatabaseURL)
		if err != nil {
			return nil, err
		}
		pc.MaxConns, pc.MinConns = 16, 16
		if !notify {
			pc.ConnConfig.RuntimeParams["pgoutbox.notify"] = "off"
		}
		p, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			return nil, fmt.Errorf("connect producers: %w", err)
		}
		defer p.Close()
		pools[notify] = p
	}
	payload := map[string]any{"customer": "c-42", "total_cents": 1999, "pad": string(make([]byte, 0))}
	if pad := c.PayloadBytes - 50; pad > 0 {
		b := make([]byte, pad)
		for i := range b {
			b[i] = 'x'
		}
		payload["pad"] = string(b)
	}
	var next atomic.Int64
	tx1 := func(pool *pgxpool.Pool, outbox, batched bool) error {
		id := next.Add(1)
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if batched {
				b := &pgx.Batch{}
				b.Queue("INSERT INTO "+orders+" VALUES ($1, 'c-42', 1999)", id)
				if _, err := prod.QueueTx(ctx, b, pgoutbox.Event{AggregateType: "order", AggregateID: strconv.FormatInt(id, 10),
					EventType: "order.placed", Payload: payload}); err != nil {
					return err
				}
				return tx.SendBatch(ctx, b).Close()
			}
			if _, err := tx.Exec(ctx, "INSERT INTO "+orders+" VALUES ($1, 'c-42', 1999)", id); err != nil {
				return err
			}
			if outbox {
				_, err := prod.EnqueueTx(ctx, tx, pgoutbox.Event{AggregateType: "order", AggregateID: strconv.FormatInt(id, 10),
					EventType: "order.placed", Payload: payload})
				return err
			}
			return nil
		})
	}
	type cellSpec struct {
		producers                      int
		outbox, batched, notify, relay bool
	}
	var specs []cellSpec
	for _, n := range []int{1, 16} {
		specs = append(specs, cellSpec{n, false, false, true, false}, cellSpec{n, true, false, true, false},
			cellSpec{n, true, false, false, false}, cellSpec{n, true, true, true, false})
	}
	specs = append(specs, cellSpec{16, true, false, true, true}, cellSpec{16, true, false, false, true})
	res := &EnqueueResult{Method: enqueueMethod, DurationS: c.Duration.Seconds()}
	var procs []*relayProc
	defer func() { _ = stopRelays(procs) }()
	for _, sp := range specs {
		pool := pools[sp.notify]
		label := fmt.Sprintf("%d producer(s), outbox %s, NOTIFY %s", sp.producers, onOff(sp.outbox), onOff(sp.notify))
		if !sp.outbox {
			label = fmt.Sprintf("%d producer(s), no outbox", sp.producers)
		}
		if sp.batched {
			label += ", batched with the INSERT"
		}
		if sp.relay {
			label += ", relay running"
			if procs == nil {
				null, err := r.broker(ctx, "null")
				if err != nil {
					return res, err
				}
				if procs, err = r.startRelays(ctx, 1, relayOpts{schema: s.name, broker: null}); err != nil {
					return res, err
				}
			}
		}
		r.prog.step("enqueue: %s", label)
		// Warm every connection's statement cache before timing.
		for range sp.producers {
			if err := tx1(pool, sp.outbox, sp.batched); err != nil {
				return res, fmt.Errorf("warm-up: %w", err)
			}
		}
		var commits atomic.Int64
		hists := make([]*hdrhistogram.Histogram, sp.producers)
		errs := make([]error, sp.producers)
		start := time.Now()
		stop := start.Add(c.Duration)
		var wg sync.WaitGroup
		for i := range sp.producers {
			hists[i] = hdrhistogram.New(1, 60_000_000, 3)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(stop) && ctx.Err() == nil {
					t := time.Now()
					if err := tx1(pool, sp.outbox, sp.batched); err != nil {
						errs[i] = err
						return
					}
					_ = hists[i].RecordValue(time.Since(t).Microseconds())
					commits.Add(1)
				}
			}()
		}
		for done := false; !done; {
			select {
			case <-time.After(250 * time.Millisecond):
				el := time.Since(start)
				r.prog.update("enqueue: %s: %.0f commits/s (%.0fs left)", label, float64(commits.Load())/el.Seconds(),
					max(0, (c.Duration-el).Seconds()))
				done = el >= c.Duration
			case <-ctx.Done():
				done = true
			}
		}
		wg.Wait()
		el := time.Since(start)
		for _, err := range errs {
			if err != nil {
				return res, fmt.Errorf("%s: %w", label, err)
			}
		}
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		h := hdrhistogram.New(1, 60_000_000, 3)
		for _, x := range hists {
			h.Merge(x)
		}
		n := commits.Load()
		if err := sampleAll(procs); err != nil {
			return res, err
		}
		res.Cells = append(res.Cells, EnqueueCell{Producers: sp.producers, Outbox: sp.outbox, Batched: sp.batched, Notify: sp.notify, Relay: sp.relay,
			Commits: n, Seconds: round3(el.Seconds()), CommitsPerSec: round2(float64(n) / el.Seconds()),
			P50Ms: round3(float64(h.ValueAtQuantile(50)) / 1000), P99Ms: round3(float64(h.ValueAtQuantile(99)) / 1000)})
	}
	if err := stopRelays(procs); err != nil {
		return res, err
	}
	if len(procs) > 0 {
		res.RelayRSS = rssOf(procs)
		res.MaxRSSMiB = maxRSSMiB(res.RelayRSS)
	}
	procs = nil
	cps := func(p int, outbox, notify, relay bool) float64 { return res.cellRate(p, outbox, false, notify, relay) }
	res.Ratios = EnqueueRatios{
		OutboxTimeRatio1:    ratio(cps(1, false, true, false), cps(1, true, true, false)),
		OutboxTimeRatio16:   ratio(cps(16, false, true, false), cps(16, true, true, false)),
		BatchedTimeRatio1:   ratio(cps(1, false, true, false), res.cellRate(1, true, true, true, false)),
		BatchedTimeRatio16:  ratio(cps(16, false, true, false), res.cellRate(16, true, true, true, false)),
		NotifyCost1NoRelay:  round3(1 - ratio(cps(1, true, true, false), cps(1, true, false, false))),
		NotifyCost16NoRelay: round3(1 - ratio(cps(16, true, true, false), cps(16, true, false, false))),
		NotifyCost16:        round3(1 - ratio(cps(16, true, true, true), cps(16, true, false, true))),
	}
	return res, nil
}

// cellRate is the commits/s of the cell so described, 0 if it did not run.
func (res *EnqueueResult) cellRate(p int, outbox, batched, notify, relay bool) float64 {
	for _, cl := range res.Cells {
		if cl.Producers == p && cl.Outbox == outbox && cl.Batched == batched && (!outbox || cl.Notify == notify) && cl.Relay == relay {
			return cl.CommitsPerSec
		}
	}
	return 0
}

// outboxLabel says how the cell enqueued: no, yes (EnqueueTx) or batched (QueueTx).
func (cl EnqueueCell) outboxLabel() string {
	switch {
	case cl.Batched:
		return "batched"
	case cl.Outbox:
		return "yes"
	}
	return "no"
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
