package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
)

func newReplayCmd() *cobra.Command {
	var (
		db           dbFlags
		bf           brokerFlags
		lf           logFlags
		req          admin.ReplayRequest
		since, until string
		eventIDs     []string
		all          bool
		op           operatorFlags
		tenants      tenantFlags
	)
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Re-publish already-published events, in order per aggregate, with their ids",
		Long: `Re-publish events the relay already published: selected by aggregate, event type,
time range (occurred_at) or event ids, to the original destination or another one
(--topic-template), each aggregate's events in sequence order, with the same event
ids and headers, so consumers deduplicate what they already applied. Skipped dead
letters are never replayed. A selection is required: without one, --all says
"every published event" explicitly. The outbox rows are only read: a replay does not
disturb the relays. Only events still in the outbox (younger than the cleanup
retention) can be replayed.

It prints the number of selected events first (--dry-run stops there), then its
progress on a terminal, then a summary line. A broker that is down is waited for;
a refusal stops the replay with how far it got.

NATS JetStream: each replayed message has its own Nats-Msg-Id (<event id>:replay:
<run id>), so the stream stores it even within its duplicate window.

Each replay is recorded in the operator audit (pgoutbox dlq audit) before it
publishes anything: --actor, --reason, the database user, the selection, the
destination and the count, then its outcome.

--tenants: a replay works on one outbox. The selector must match exactly one
tenant; with --event-id as the only selection, the ids are looked up in the
selected tenants and must all be in the same one.

` + brokerHelp,
		Example: `  pgoutbox replay --aggregate-type order --since 24h --dry-run
  pgoutbox replay --aggregate-type order --aggregate-id 42 --broker nats://nats:4222
  pgoutbox replay --event-id 0190f1c2-... --event-id 0190f1c3-... --broker nats://nats:4222 \
      --topic-template 'replay.{aggregate_type}.{event_type}' --nats-stream REPLAY
  pgoutbox replay --since 2024-05-01T00:00:00Z --until 2024-05-02T00:00:00Z --broker kafka://kafka:9092`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := db.validate(); err != nil {
				return err
			}
			now := time.Now()
			var err error
			if req.Filter.Since, err = parseWhen(since, now); err != nil {
				return usagef("--since: %v", err)
			}
			if req.Filter.Until, err = parseWhen(until, now); err != nil {
				return usagef("--until: %v", err)
			}
			if !req.Filter.Since.IsZero() && !req.Filter.Until.IsZero() && !req.Filter.Until.After(req.Filter.Since) {
				return usagef("--until %s is not after --since %s", req.Filter.Until.Format(time.RFC3339), req.Filter.Since.Format(time.RFC3339))
			}
			for _, s := range eventIDs {
				id, err := pgoutbox.ParseUUID(strings.TrimSpace(s))
				if err != nil {
					return usagef("--event-id %q: %v", s, err)
				}
				req.Filter.EventIDs = append(req.Filter.EventIDs, id)
			}
			if req.BatchSize < 1 {
				return usagef("--batch-size must be positive, got %d", req.BatchSize)
			}
			f := req.Filter
			selected := f.AggregateType != "" || f.AggregateID != "" || f.EventType != "" || !f.Since.IsZero() ||
				!f.Until.IsZero() || len(f.EventIDs) > 0
			switch {
			case !selected && !all:
				return usagef("replay: say which events: --aggregate-type, --aggregate-id, --event-type, --since, --until, --event-id, or --all for every published event")
			case selected && all:
				return usagef("replay: give a selection or --all, not both")
			}
			req.Actor, req.Reason = op.actor, op.reason
			many, err := tenants.parse(cmd.Flags())
			if err != nil {
				return err
			}
			if many {
				if db.schema, err = replayTenant(cmd.Context(), &db, &tenants, f); err != nil {
					return err
				}
			}
			return runReplay(cmd.Context(), &db, &bf, &lf, req, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	fs := cmd.Flags()
	db.register(fs)
	bf.register(fs)
	lf.register(fs)
	fs.StringVar(&req.Filter.AggregateType, "aggregate-type", "", "only events of this aggregate type")
	fs.StringVar(&req.Filter.AggregateID, "aggregate-id", "", "only events of this aggregate id")
	fs.StringVar(&req.Filter.EventType, "event-type", "", "only events of this event type")
	fs.StringVar(&since, "since", "", "only events that occurred at or after this time: RFC 3339, a date (UTC), or a duration ago such as 24h")
	fs.StringVar(&until, "until", "", "only events that occurred before this time (same forms as --since)")
	fs.StringSliceVar(&eventIDs, "event-id", nil, "only these events (repeat the flag or separate ids with commas)")
	fs.BoolVar(&req.DryRun, "dry-run", false, "count the selected events and publish nothing")
	op.register(fs, "replaying")
	fs.BoolVar(&all, "all", false, "replay every published event still in the outbox (needed when no other selection is given)")
	fs.IntVar(&req.BatchSize, "batch-size", 500, "events read and published at once (env PGOUTBOX_REPLAY_BATCH_SIZE)")
	tenants.register(fs, "a replay works on one outbox: the selector must match one tenant, or with --event-id alone the ids must all be in one of them")
	return cmd
}

// replayTenant resolves --tenants to the one outbox a replay works on: the
// tenant holding every --event-id when the ids are the whole selection, else the
// one tenant the selector matches. A replay publishes to a broker under one
// audit row: one run never spans tenants.
func replayTenant(ctx context.Context, db *dbFlags, tf *tenantFlags, f admin.ReplayFilter) (string, error) {
	byID := len(f.EventIDs) > 0 && f.AggregateType == "" && f.AggregateID == "" && f.EventType == "" && f.Since.IsZero() && f.Until.IsZero()
	if !byID {
		return oneTenant(ctx, db, tf, "replay", ", or select by --event-id alone")
	}
	groups, err := findTenants(ctx, db, tf, f.EventIDs)
	if err != nil {
		return "", err
	}
	if len(groups) > 1 {
		var where []string
		for _, g := range groups {
			where = append(where, fmt.Sprintf("%s: %d", tenantName(g.Tenant), len(g.IDs)))
		}
		return "", usagef("replay works on one outbox, but the --event-id events are in %d tenants (%s): run one replay per tenant",
			len(groups), strings.Join(where, ", "))
	}
	return groups[0].Tenant, nil
}

// parseWhen reads a --since/--until value: empty (open), RFC 3339, a date
// (midnight UTC), or a duration meaning that long before now.
func parseWhen(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%q is not a time (2024-05-01T12:00:00Z, 2024-05-01) or a positive duration ago (24h)", s)
}

func runReplay(ctx context.Context, db *dbFlags, bf *brokerFlags, lf *logFlags, req admin.ReplayRequest,
	stdout, stderr io.Writer) error {
	logger, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	var target *brokerTarget
	if !req.DryRun {
		if target, err = bf.parse(); err != nil {
			return err
		}
	}
	conn, err := db.connectMigrated(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	req.Schema = db.schema

	// The count first, from its own dry run: the operator sees what is coming
	// before anything is published.
	dryReq := req
	dryReq.DryRun = true
	count, err := admin.Replay(ctx, conn, nil, dryReq)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d events selected%s\n", count.Total, byType(count.ByAggregateType))
	if req.DryRun || count.Total == 0 {
		if req.DryRun {
			fmt.Fprintln(stdout, "dry run: nothing published")
		}
		return nil
	}

	pub, closeBroker, err := target.open(ctx, logger)
	if err != nil {
		return err
	}
	defer closeBroker()
	req.Destination = target.describe()
	tty := progressTTY(stdout)
	req.Progress = func(p admin.ReplayProgress) {
		if tty {
			fmt.Fprintf(stdout, "\rreplayed %d of %d events", p.Published, count.Total)
		}
	}
	res, err := admin.Replay(ctx, conn, pub, req)
	if tty {
		fmt.Fprint(stdout, "\r\x1b[K")
	}
	if errors.Is(err, admin.ErrInvalidAuditText) {
		return usageError{err}
	}
	if err != nil {
		var re *admin.ReplayError
		if errors.As(err, &re) {
			fmt.Fprintf(stdout, "replayed %d of %d events, then stopped\n", res.Published, count.Total)
		}
		return err
	}
	fmt.Fprintf(stdout, "replayed %d events in %d batches in %s (run %s)\n", res.Published, res.Batches,
		res.Duration.Round(time.Millisecond), res.RunID)
	return nil
}

// byType formats counts per aggregate type: " (order: 3, user: 1)".
func byType(m map[string]int64) string {
	if len(m) == 0 {
		return ""
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s: %d", k, m[k]))
	}
	return " (" + strings.Join(parts, ", ") + ")"
}
