package faulttest

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/checker"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// kill is one SIGKILL of the soak and how long the system took to recover from it.
//
// Recovery is measured from the replacement's start:
//   - relay: until every event that occurred before the kill is published (the
//     dead relay's leases expire after 2s and another relay takes them);
//   - consumer: until the durable's ack floor reaches the last stream sequence at
//     the kill (everything on the broker at the kill was applied and acked);
//   - producer: nothing to recover (its in-flight transaction is journaled as
//     unknown and settled by the checker).
type kill struct {
	what               string
	at, restarted      time.Time
	recovered          time.Duration
	measured, timedOut bool
}

// The chaos soak: relays, consumers and producers (with rollbacks) killed at
// random for -soak.duration, then a full drain and the checker. It prints every
// kill with its recovery time. Not parallel: it runs alone, so that its recovery
// figures measure the pipeline rather than the other tests.
func TestSoak(t *testing.T) {
	if *soakDuration <= 0 {
		t.Skip("-soak.duration=0")
	}
	e := newEnv(t, envConfig{})
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d; %d relays, %d consumers, %d producers; chaos for %s", seed, *soakRelays, *soakConsumers, *soakProducers, *soakDuration)
	rng := rand.New(rand.NewPCG(seed, 2))
	f := newFleet(e, *soakRelays, *soakConsumers)

	popts := producerOpts{txs: 0, aggregates: 40, rollbackPercent: 15, pause: 20 * time.Millisecond}
	producers := make([]*proc, *soakProducers)
	incarnation := 0
	startProducer := func(i int) {
		incarnation++
		producers[i] = e.producer(fmt.Sprintf("p%d-%d", i, incarnation), nil, popts)
	}
	for i := range producers {
		startProducer(i)
	}

	var (
		kills []*kill
		wg    sync.WaitGroup
	)
	start := time.Now()
	end := start.Add(*soakDuration)
	for time.Now().Before(end) {
		time.Sleep(time.Duration(500+rng.IntN(2000)) * time.Millisecond) // chaos pacing
		k := &kill{}
		if rng.IntN(8) == 0 {
			i := rng.IntN(len(producers))
			k.what, k.at = "producer", time.Now()
			producers[i].kill(t)
			k.restarted = time.Now()
			startProducer(i)
		} else {
			var lastSeq uint64
			if s, err := e.js.Stream(context.Background(), e.stream); err == nil {
				if info, err := s.Info(context.Background()); err == nil {
					lastSeq = info.State.LastSeq
				}
			}
			k.what, k.at, k.restarted = f.kill(t, rng)
			wg.Add(1)
			go func() {
				defer wg.Done()
				measureRecovery(e, k, lastSeq)
			}()
		}
		kills = append(kills, k)
	}
	chaos := time.Since(start)
	for _, p := range producers {
		p.term(t)
	}
	wg.Wait()
	e.waitDrained(3 * time.Minute)
	e.stopAll()
	v := e.verdict()

	var b strings.Builder
	fmt.Fprintf(&b, "soak: %s of chaos, %d kills; %.0f committed events/s\n", chaos.Round(time.Second), len(kills),
		float64(v.Committed)/chaos.Seconds())
	rec := map[string][]time.Duration{}
	for i, k := range kills {
		fmt.Fprintf(&b, "  kill %2d at +%6s %-8s", i+1, k.at.Sub(start).Round(100*time.Millisecond), k.what)
		switch {
		case k.timedOut:
			fmt.Fprintf(&b, " NOT recovered within a minute\n")
		case k.measured:
			fmt.Fprintf(&b, " recovered %s after restart\n", k.recovered.Round(10*time.Millisecond))
			rec[k.what] = append(rec[k.what], k.recovered)
		default:
			b.WriteString(" (nothing to recover)\n")
		}
	}
	for _, what := range []string{"relay", "consumer"} {
		d := rec[what]
		if len(d) == 0 {
			continue
		}
		slices.Sort(d)
		fmt.Fprintf(&b, "  %s recovery over %d kills: min %s, median %s, max %s\n", what, len(d),
			d[0].Round(10*time.Millisecond), d[len(d)/2].Round(10*time.Millisecond), d[len(d)-1].Round(10*time.Millisecond))
	}
	b.WriteString("  " + v.String())
	t.Log(b.String())
	mustHold(t, v)
	for i, k := range kills {
		if k.timedOut {
			t.Errorf("kill %d (%s) did not recover within a minute", i+1, k.what)
		}
	}
	if len(kills) < 3 {
		t.Fatalf("only %d kills; the soak proves little", len(kills))
	}
}

// measureRecovery polls until the system recovered from k (see kill), at most a
// minute after the restart.
func measureRecovery(e *env, k *kill, lastSeq uint64) {
	deadline := k.restarted.Add(time.Minute)
	ctx := context.Background()
	for time.Now().Before(deadline) {
		done := false
		switch k.what {
		case "relay":
			var n int
			err := e.pool.QueryRow(ctx, "SELECT count(*) FROM "+e.table("outbox_events")+" WHERE published_at IS NULL AND occurred_at <= $1", k.at).Scan(&n)
			done = err == nil && n == 0
		case "consumer":
			if c, err := e.js.Consumer(ctx, e.stream, consumerName); err == nil {
				if info, err := c.Info(ctx); err == nil {
					done = info.AckFloor.Stream >= lastSeq
				}
			}
		}
		if done {
			k.recovered, k.measured = time.Since(k.restarted), true
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	k.timedOut = true
}

// The backlog: 100,000 events enqueued with no relay running, then two relays
// drain it. Logs the drain time and rate; the checker proves every event reached
// the broker and first appearances kept each aggregate's order.
func TestBacklog(t *testing.T) {
	t.Parallel()
	const events, aggregates, perTx = 100_000, 1000, 5000
	e := newEnv(t, envConfig{dedup: 2 * time.Minute})
	ctx := context.Background()
	prod, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: e.schema})
	pgtest.Must(t, err, "producer")
	started := time.Now()
	batch := make([]pgoutbox.Event, 0, perTx)
	for n := range events {
		batch = append(batch, pgoutbox.Event{AggregateType: "acct", AggregateID: fmt.Sprintf("a%04d", n%aggregates),
			EventType: "changed", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, n))})
		if len(batch) == perTx {
			_, err := prod.EnqueueTx(ctx, e.pool, batch...) // one transaction per batch
			pgtest.Must(t, err, "enqueue up to event %d", n)
			batch = batch[:0]
		}
	}
	enqueue := time.Since(started)
	if n := e.count("outbox_events", "published_at IS NULL"); n != events {
		t.Fatalf("%d pending events, want %d", n, events)
	}

	started = time.Now()
	r1 := e.relay("r1", nil, "--batch-size", "500", "--log-level", "warn")
	r2 := e.relay("r2", nil, "--batch-size", "500", "--log-level", "warn")
	wait.Forf(t, 4*time.Minute, func() string {
		return fmt.Sprintf("the backlog to drain (%d left)", e.count("outbox_events", "published_at IS NULL"))
	}, func() bool { e.failOnCrash(); return e.count("outbox_events", "published_at IS NULL") == 0 })
	drain := time.Since(started)
	r1.term(t)
	r2.term(t)

	// No journal, business rows or consumer here: the outbox and the broker.
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	readStart := time.Now()
	var in checker.Input
	in.Outbox, err = checker.ReadOutbox(rctx, e.pool, e.schema)
	pgtest.Must(t, err, "read outbox")
	in.Broker, err = checker.ReadJetStream(rctx, e.js, e.stream)
	pgtest.Must(t, err, "read stream")
	read := time.Since(readStart)
	v := checker.Check(in)
	t.Logf("read the outbox and the stream in %s, checked in %s", read.Round(time.Millisecond), (time.Since(readStart) - read).Round(time.Millisecond))
	mustHold(t, v)
	if v.Committed != events {
		t.Fatalf("checked %d events, want %d", v.Committed, events)
	}
	var per []string
	rows, err := e.pool.Query(ctx, "SELECT claimed_by || ': ' || count(*) FROM "+e.table("outbox_events")+" GROUP BY claimed_by ORDER BY 1")
	pgtest.Must(t, err, "per relay")
	for rows.Next() {
		var s string
		pgtest.Must(t, rows.Scan(&s), "scan")
		per = append(per, s)
	}
	pgtest.Must(t, rows.Err(), "per relay")
	t.Logf("backlog: %d events over %d aggregates enqueued in %s; 2 relays drained it in %s (%.0f events/s; last holders %v); per-aggregate order held",
		events, aggregates, enqueue.Round(time.Millisecond), drain.Round(time.Millisecond), float64(events)/drain.Seconds(), per)
}
