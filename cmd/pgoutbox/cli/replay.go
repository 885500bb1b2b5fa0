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
		dest         destinationFlag
		destFile     string
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

--destination NAME: replay to one destination of a relay with destinations
(pgoutbox destinations list) and to no other: of the selected events, those that
destination has already passed (its progress per aggregate lane) and that its
rules, as the relay last registered them, route to it; never the events skipped
for it (dlq skip --destination) or in the outbox (dlq skip). An event the outbox
quarantined as routed to no destination is replayed once the destination's rules
take it. Events it has not reached yet are left to the relay. It publishes
through that destination's broker and settings, read from the relay's
--destinations-file (no --broker or broker flag then; --dry-run needs no file).
Progress is not changed: neither that destination's nor the others'. The audit
records the destination's name and its broker. An unknown name is an error
naming it; with no destination registered, it says so. Not with --tenants.

--tenants: a replay works on one outbox. The selector must match exactly one
tenant; with --event-id as the only selection, the ids are looked up in the
selected tenants and must all be in the same one.

` + brokerHelp,
		Example: `  pgoutbox replay --aggregate-type order --since 24h --dry-run
  pgoutbox replay --aggregate-type order --aggregate-id 42 --broker nats://nats:4222
  pgoutbox replay --event-id 0190f1c2-... --event-id 0190f1c3-... --broker nats://nats:4222 \
      --topic-template 'replay.{aggregate_type}.{event_type}' --nats-stream REPLAY
  pgoutbox replay --since 2024-05-01T00:00:00Z --until 2024-05-02T00:00:00Z --broker kafka://kafka:9092
  pgoutbox replay --destination analytics --destinations-file /etc/pgoutbox/destinations.yaml \
      --aggregate-type order --since 24h --reason "analytics lost a day, TICKET-7"`,
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
			target := bf.parse
			on, err := dest.parse("replay", cmd.Flags())
			switch {
			case err != nil:
				return err
			case on:
				req.ToDestination = dest.name
				target = func() (*brokerTarget, error) { return destinationTarget(cmd.Context(), dest.name, destFile) }
				if err := checkDestinationsAlone(cmd.Flags(), false, false); err != nil && destFile != "" {
					return err
				}
			case destFile != "":
				return usagef("replay: --destinations-file goes with --destination NAME (the destination whose broker it names)")
			}
			many, err := tenants.parse(cmd.Flags())
			if err != nil {
				return err
			}
			if many {
				if db.schema, err = replayTenant(cmd.Context(), &db, &tenants, f); err != nil {
					return err
				}
			}
			return runReplay(cmd.Context(), &db, target, &lf, req, cmd.OutOrStdout(), cmd.ErrOrStderr())
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
	dest.register(fs, "replay to this destination of a relay with destinations only: the selected events it has passed and its rules route to it (pgoutbox destinations list)")
	// No environment variable: a file left named in a shell must not turn a
	// replay into a destination's.
	fs.StringVar(&destFile, "destinations-file", "", "with --destination: the relay's destinations file, for that destination's broker and settings")
	return cmd
}

// destinationTarget is the broker of destination name as the relay's
// destinations file sets it: its URL (or broker_env) and settings, checked and
// not connected. A file without it is a usage error naming both.
func destinationTarget(ctx context.Context, name, path string) (*brokerTarget, error) {
	if path == "" {
		return nil, usagef("replay --destination %s needs --destinations-file: the relay's file names the destination's broker and settings", name)
	}
	df, err := readDestinationsFile(ctx, path)
	if err != nil {
		return nil, err
	}
	for _, d := range df.destinations {
		if d.name == name {
			return d.target, nil
		}
	}
	return nil, usagef("replay: --destinations-file %s has no destination %s (it has %s)", path, name, df.names())
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

// runReplay runs the replay req, to the broker parseTarget returns (called
// unless it is a dry run, before connecting to anything).
func runReplay(ctx context.Context, db *dbFlags, parseTarget func() (*brokerTarget, error), lf *logFlags, req admin.ReplayRequest,
	stdout, stderr io.Writer) error {
	logger, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	var target *brokerTarget
	if !req.DryRun {
		if target, err = parseTarget(); err != nil {
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
	to := ""
	if req.ToDestination != "" {
		to = " for destination " + req.ToDestination
	}
	fmt.Fprintf(stdout, "%d events selected%s%s\n", count.Total, to, byType(count.ByAggregateType))
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
