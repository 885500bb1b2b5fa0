package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
)

// DestinationsResult is the destinations scenario: one backlog drained by one
// relay to 1, 2 and 3 destinations (null brokers: the relay's and the
// database's cost, not a broker's), and the cost of a write to an outbox with 3
// destinations registered against one with none.
type DestinationsResult struct {
	Method string                `json:"method"`
	Drains []DestinationDrainRun `json:"drains"`
	// Enqueue compares the producer's transaction with 3 destinations
	// registered and with none; nil when it did not run.
	Enqueue *DestinationEnqueue `json:"enqueue,omitempty"`
}

// DestinationDrainRun is one drain of the backlog to Destinations destinations.
type DestinationDrainRun struct {
	Destinations int     `json:"destinations"`
	Events       int     `json:"events"`
	Deliveries   int64   `json:"deliveries"` // Events × Destinations, every one checked done
	Seconds      float64 `json:"seconds"`    // from the backlog's commit to the last event done
	// PerDestinationPerSec is the events each destination received per second;
	// TotalPerSec the deliveries of all destinations per second.
	PerDestinationPerSec float64 `json:"per_destination_per_sec"`
	TotalPerSec          float64 `json:"total_per_sec"`
	// RelayCPUPerDeliveryUs is the relay's CPU time (user + system) per delivery.
	RelayCPUPerDeliveryUs float64 `json:"relay_cpu_per_delivery_us"`
	// RatioToSingle is TotalPerSec over the single-destination drain's of the
	// same run (the target: at least 0.8 with 3 destinations).
	RatioToSingle float64 `json:"ratio_to_single"`
}

// DestinationEnqueue is the producer's one-event transaction, timed in
// interleaved rounds on one connection, in an outbox with 3 destinations
// registered and in one with none.
type DestinationEnqueue struct {
	Rounds         int     `json:"rounds"`
	NoneTxPerSec   float64 `json:"none_tx_per_sec"`
	ThreeTxPerSec  float64 `json:"three_tx_per_sec"`
	NoneMeanUs     float64 `json:"none_mean_us"`
	ThreeMeanUs    float64 `json:"three_mean_us"`
	RatioThreeNone float64 `json:"ratio_three_none"` // mean transaction time, 3 destinations over none (target ≤ 1.05)
}

// destinationCounts are the destination counts the drain is timed with.
var destinationCounts = []int{1, 2, 3}

func (r *Runner) destinations(ctx context.Context) (*DestinationsResult, error) {
	c := r.cfg
	res := &DestinationsResult{Method: fmt.Sprintf("one relay (--destinations-file, null:// brokers, start backfill) drains %d events over %d aggregates to 1, 2 and 3 destinations, each taking every event; "+
		"enqueue: one-event transactions on one connection, %d interleaved rounds, outbox with 3 registered destinations vs none", c.Events, c.Aggregates, c.EnqueueRounds)}
	dir, err := os.MkdirTemp("", "pgoutbox-bench-destinations")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	for _, k := range destinationCounts {
		run, err := r.destinationDrain(ctx, dir, k)
		if err != nil {
			return res, fmt.Errorf("drain to %d destination(s): %w", k, err)
		}
		res.Drains = append(res.Drains, *run)
	}
	for i := range res.Drains {
		res.Drains[i].RatioToSingle = round2(ratio(res.Drains[i].TotalPerSec, res.Drains[0].TotalPerSec))
	}
	if res.Enqueue, err = r.destinationEnqueue(ctx, dir); err != nil {
		return res, fmt.Errorf("enqueue: %w", err)
	}
	return res, nil
}

// destinationsFile writes a destinations file of k null destinations taking
// every event.
func destinationsFile(dir string, k int) (string, error) {
	var b strings.Builder
	b.WriteString("destinations:\n")
	for i := range k {
		fmt.Fprintf(&b, "  - name: d%d\n    broker: \"null://\"\n    start: backfill\n    rules:\n      - all: true\n", i+1)
	}
	path := filepath.Join(dir, fmt.Sprintf("destinations-%d-%s.yaml", k, randHex(2)))
	return path, os.WriteFile(path, []byte(b.String()), 0o600)
}

// startDestinationsRelay starts one relay on schema with the destinations of file.
func (r *Runner) startDestinationsRelay(schema, file string) (*relayProc, error) {
	id := fmt.Sprintf("bench-%s-dest", randHex(2))
	args := append([]string{"relay", "--schema", schema, "--destinations-file", file, "--id", id,
		"--batch-size", strconv.Itoa(r.cfg.BatchSize), "--poll-interval", r.cfg.PollInterval.String(),
		"--shutdown-timeout", "60s"}, r.cfg.RelayArgs...)
	p, err := r.startRelay(id, args, append(relayEnv(), "DATABASE_URL="+r.cfg.DatabaseURL))
	if err != nil {
		return nil, err
	}
	select {
	case <-p.ready:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("relay %s exited before starting: %v: %s", p.id, p.waitErr, p.tail())
	case <-time.After(60 * time.Second):
		_ = p.stop()
		return nil, fmt.Errorf("relay %s did not start within 60s: %s", p.id, p.tail())
	}
}

func (r *Runner) destinationDrain(ctx context.Context, dir string, k int) (*DestinationDrainRun, error) {
	c := r.cfg
	s, err := r.newSchema(ctx, "dest")
	if err != nil {
		return nil, err
	}
	defer r.dropSchema(s)
	file, err := destinationsFile(dir, k)
	if err != nil {
		return nil, err
	}
	r.prog.step("destinations: starting a relay with %d destination(s)", k)
	p, err := r.startDestinationsRelay(s.name, file)
	if err != nil {
		return nil, err
	}
	procs := []*relayProc{p}
	defer stopRelays(procs)
	r.prog.step("destinations: loading %d events", c.Events)
	t0, err := r.loadBacklog(ctx, s, c.Events, c.Aggregates, c.PayloadBytes, "a", false)
	if err != nil {
		return nil, err
	}
	// An event is done once every destination passed it.
	err = r.waitPublished(ctx, s, procs, max(5*time.Minute, time.Duration(k*c.Events/200)*time.Second), func(el time.Duration) error {
		r.prog.update("destinations: %d destination(s): draining, %s", k, el.Round(time.Second))
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := stopRelays(procs); err != nil {
		return nil, err
	}
	// Every destination passed every event: its lanes' cursors sum to the backlog.
	var passed int64
	if err := r.admin.QueryRow(ctx, "SELECT coalesce(sum(delivered_sequence), 0) FROM "+
		pgx.Identifier{s.name, "outbox_destination_lanes"}.Sanitize()).Scan(&passed); err != nil {
		return nil, fmt.Errorf("read the destinations' progress: %w", err)
	}
	want := int64(k) * int64(c.Events)
	if passed != want {
		return nil, fmt.Errorf("the destinations passed %d deliveries, want %d", passed, want)
	}
	var end time.Time
	if err := r.admin.QueryRow(ctx, "SELECT max(published_at) FROM "+s.events).Scan(&end); err != nil {
		return nil, fmt.Errorf("last publish: %w", err)
	}
	el := max(end.Sub(t0), time.Millisecond)
	return &DestinationDrainRun{Destinations: k, Events: c.Events, Deliveries: want, Seconds: round3(el.Seconds()),
		PerDestinationPerSec:  round2(float64(c.Events) / el.Seconds()),
		TotalPerSec:           round2(float64(want) / el.Seconds()),
		RelayCPUPerDeliveryUs: round2(float64(p.cpu().Microseconds()) / float64(want))}, nil
}

// destinationEnqueue times one-event transactions in an outbox with 3
// destinations registered (a relay started with them once, then stopped) and
// in one with none, in interleaved rounds on one connection each.
func (r *Runner) destinationEnqueue(ctx context.Context, dir string) (*DestinationEnqueue, error) {
	c := r.cfg
	none, err := r.newSchema(ctx, "dest_none")
	if err != nil {
		return nil, err
	}
	defer r.dropSchema(none)
	three, err := r.newSchema(ctx, "dest_three")
	if err != nil {
		return nil, err
	}
	defer r.dropSchema(three)
	file, err := destinationsFile(dir, 3)
	if err != nil {
		return nil, err
	}
	r.prog.step("destinations: registering 3 destinations")
	p, err := r.startDestinationsRelay(three.name, file)
	if err != nil {
		return nil, err
	}
	if err := p.stop(); err != nil {
		return nil, err
	}
	var registered int
	if err := r.admin.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{three.name, "outbox_destinations"}.Sanitize()).Scan(&registered); err != nil {
		return nil, fmt.Errorf("read the registered destinations: %w", err)
	}
	if registered != 3 {
		return nil, fmt.Errorf("%d destinations registered, want 3", registered)
	}
	pool, err := r.producerPool(ctx, 2, false)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	payload := map[string]any{"pad": strings.Repeat("x", c.PayloadBytes)}
	type cell struct {
		schema string
		prod   *pgoutbox.Producer
		n      int
		took   time.Duration
	}
	cells := []*cell{{schema: none.name}, {schema: three.name}}
	for _, cl := range cells {
		if cl.prod, err = pgoutbox.NewProducer(&pgoutbox.Config{Schema: cl.schema}); err != nil {
			return nil, err
		}
	}
	slice := max(c.Duration/time.Duration(2*c.EnqueueRounds), minEnqueueSlice)
	for round := range c.EnqueueRounds {
		for _, cl := range cells {
			r.prog.update("destinations: enqueue round %d/%d, %s", round+1, c.EnqueueRounds, cl.schema)
			if err := enqueueFor(ctx, pool, cl.prod, slice, payload, &cl.n, &cl.took); err != nil {
				return nil, err
			}
		}
	}
	mean := func(cl *cell) float64 { return float64(cl.took.Microseconds()) / float64(max(cl.n, 1)) }
	out := &DestinationEnqueue{Rounds: c.EnqueueRounds,
		NoneTxPerSec: round2(float64(cells[0].n) / cells[0].took.Seconds()), ThreeTxPerSec: round2(float64(cells[1].n) / cells[1].took.Seconds()),
		NoneMeanUs: round2(mean(cells[0])), ThreeMeanUs: round2(mean(cells[1]))}
	out.RatioThreeNone = round3(ratio(out.ThreeMeanUs, out.NoneMeanUs))
	return out, nil
}

// enqueueFor commits one-event transactions for d, adding to n and took.
func enqueueFor(ctx context.Context, pool *pgxpool.Pool, prod *pgoutbox.Producer, d time.Duration, payload map[string]any, n *int, took *time.Duration) error {
	start := time.Now()
	for time.Since(start) < d {
		id := strconv.Itoa(*n)
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := prod.EnqueueTx(ctx, tx, pgoutbox.Event{AggregateType: "order", AggregateID: id, EventType: "order.placed", Payload: payload})
			return err
		}); err != nil {
			return err
		}
		*n++
	}
	*took += time.Since(start)
	return nil
}

// writeText prints the destination cells.
func (d *DestinationsResult) writeText(w io.Writer) {
	fmt.Fprintf(w, "\ndestinations (%s)\n", d.Method)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "  destinations\tevents\tseconds\tper destination/s\ttotal deliveries/s\tvs 1 destination\trelay CPU µs/delivery\t\n")
	for _, r := range d.Drains {
		fmt.Fprintf(tw, "  %d\t%d\t%.2f\t%.0f\t%.0f\t%.2f×\t%.1f\t\n", r.Destinations, r.Events, r.Seconds, r.PerDestinationPerSec,
			r.TotalPerSec, r.RatioToSingle, r.RelayCPUPerDeliveryUs)
	}
	tw.Flush()
	if e := d.Enqueue; e != nil {
		fmt.Fprintf(w, "  enqueue, 3 destinations registered vs none: %.0f vs %.0f tx/s, mean %.0f vs %.0f µs: ratio %.3f\n",
			e.ThreeTxPerSec, e.NoneTxPerSec, e.ThreeMeanUs, e.NoneMeanUs, e.RatioThreeNone)
	}
}
