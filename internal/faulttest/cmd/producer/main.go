// Command producer is the fault-injection suite's producer: it writes business rows
// and their outbox events in one transaction per step, rolls some back on purpose,
// and journals every attempt (checker.Journal) so the checker knows what was meant
// to commit. The failpoints producer/before-commit and producer/after-commit sit
// around its commit (PGOUTBOX_FAILPOINTS).
//
// It stops after --txs transactions, or on SIGTERM/SIGINT after the transaction in
// progress, and prints one "produced ..." line.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/checker"
	"github.com/pgoutbox/pgoutbox/internal/failpoint"
	"github.com/pgoutbox/pgoutbox/internal/faulttest/cmd/command"
	"github.com/pgoutbox/pgoutbox/migrate"
)

var (
	dbURL      = flag.String("database-url", os.Getenv("DATABASE_URL"), "database")
	schema     = flag.String("schema", "public", "schema of the outbox and of the business table")
	journal    = flag.String("journal", "", "journal file (appended)")
	name       = flag.String("name", "p", "prefix of transaction names and business keys; unique per process run")
	txs        = flag.Int("txs", 100, "transactions to attempt; 0: until SIGTERM")
	aggregates = flag.Int("aggregates", 20, "aggregates to spread events over")
	aggPrefix  = flag.String("aggregate-prefix", "agg", "aggregate id prefix")
	aggTypes   = flag.String("aggregate-types", "acct", "comma-separated aggregate types, one picked at random per transaction")
	eventTypes = flag.String("event-types", "changed", "comma-separated event types, one picked at random per event")
	maxEvents  = flag.Int("max-events", 3, "most events per transaction (1..n, random)")
	rollback   = flag.Int("rollback-percent", 20, "share of transactions rolled back on purpose")
	pause      = flag.Duration("pause", 2*time.Millisecond, "pause between transactions (pacing)")
	seed       = flag.Uint64("seed", uint64(time.Now().UnixNano()), "random seed")
)

func main() { command.Main("producer", run) }

func run(ctx context.Context) error {
	if *journal == "" || *dbURL == "" {
		return errors.New("--journal and --database-url are required")
	}
	// The harness sends SIGTERM only after this line: before it, SIGTERM would
	// kill the process instead of ending it cleanly.
	fmt.Fprintln(os.Stderr, "producer started")

	pool, err := pgxpool.New(context.Background(), *dbURL)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	// As an application does at start (docs/design.md, "Version skew"): a
	// database outside this binary's compatibility window is refused.
	if err := migrate.CheckCompatible(ctx, pool, *schema, migrate.LineOutbox); err != nil {
		if ctx.Err() != nil {
			return nil // SIGTERM during the check: a clean stop before any transaction
		}
		return err
	}
	j, err := checker.OpenJournal(*journal)
	if err != nil {
		return err
	}
	defer j.Close()
	prod, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: *schema})
	if err != nil {
		return err
	}
	business := pgx.Identifier{*schema, "business"}.Sanitize()
	rng := rand.New(rand.NewPCG(*seed, 7))

	types, evTypes := strings.Split(*aggTypes, ","), strings.Split(*eventTypes, ",")
	var committed, rolledBack, unknown, failed int
	for n := 1; *txs == 0 || n <= *txs; n++ {
		if ctx.Err() != nil {
			break
		}
		tx := fmt.Sprintf("%s-%d", *name, n)
		agg := fmt.Sprintf("%s%03d", *aggPrefix, rng.IntN(*aggregates))
		aggType := types[rng.IntN(len(types))]
		events := make([]pgoutbox.Event, 1+rng.IntN(*maxEvents))
		intents := make([]checker.Intent, len(events))
		for i := range events {
			id := pgoutbox.NewEventID()
			intents[i] = checker.Intent{EventID: id, BusinessKey: fmt.Sprintf("%s-%d", tx, i)}
			events[i] = pgoutbox.Event{ID: id, AggregateType: aggType, AggregateID: agg, EventType: evTypes[rng.IntN(len(evTypes))],
				Payload: map[string]any{"tx": tx, "i": i}}
		}
		wantRollback := rng.IntN(100) < *rollback
		if err := j.Begin(tx, intents); err != nil {
			return err
		}
		outcome, err := attempt(pool, prod, business, agg, intents, events, wantRollback)
		if err != nil {
			// The database went away or refused: not fatal, the suite kills things.
			failed++
			fmt.Fprintf(os.Stderr, "producer: %s: %v\n", tx, err)
		}
		if err := j.End(tx, outcome); err != nil {
			return err
		}
		switch outcome {
		case checker.Committed:
			committed++
		case checker.RolledBack:
			rolledBack++
		default:
			unknown++
		}
		if *pause > 0 {
			time.Sleep(*pause)
		}
	}
	fmt.Printf("produced committed=%d rolled_back=%d unknown=%d failed=%d\n", committed, rolledBack, unknown, failed)
	return nil
}

// attempt runs one transaction. Every error before the commit is sent means a
// rollback; an error from the commit itself leaves the outcome unknown.
func attempt(pool *pgxpool.Pool, prod *pgoutbox.Producer, business, agg string, intents []checker.Intent,
	events []pgoutbox.Event, wantRollback bool) (checker.Outcome, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tx, err := pool.Begin(ctx)
	if err != nil {
		return checker.RolledBack, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.Background()) // after a commit: a no-op
	for i, it := range intents {
		if _, err := tx.Exec(ctx, "INSERT INTO "+business+" (key, event_id, aggregate_id) VALUES ($1, $2, $3)",
			it.BusinessKey, it.EventID, agg); err != nil {
			return checker.RolledBack, fmt.Errorf("business row %d: %w", i, err)
		}
	}
	if _, err := prod.EnqueueTx(ctx, tx, events...); err != nil {
		return checker.RolledBack, fmt.Errorf("enqueue: %w", err)
	}
	if wantRollback {
		if err := tx.Rollback(ctx); err != nil {
			return checker.RolledBack, fmt.Errorf("rollback: %w", err)
		}
		return checker.RolledBack, nil
	}
	if err := failpoint.Inject(failpoint.ProducerBeforeCommit); err != nil {
		return checker.RolledBack, err
	}
	if err := tx.Commit(ctx); err != nil {
		return checker.Unknown, fmt.Errorf("commit: %w", err)
	}
	if err := failpoint.Inject(failpoint.ProducerAfterCommit); err != nil {
		return checker.Unknown, err
	}
	return checker.Committed, nil
}
