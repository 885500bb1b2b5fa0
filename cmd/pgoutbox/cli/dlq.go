package cli

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/internal/visible"
)

// The selection and audit flags of dlq (filters, --all, --reason) deliberately
// have no environment variable: a variable left set in a shell must never decide
// which events are retried or skipped, nor speak for the operator.

func newDLQCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "Inspect, retry or skip dead letters (quarantined events)",
		Long: `Dead letters are events the relay quarantined: the broker refused them
permanently, or they failed --max-attempts times. Each one blocks the later events
of its aggregate, which wait so that order is kept.

  list    the quarantined events, filtered by aggregate, type or error text
  show    one event with its payload, headers and last error
  retry   lift the quarantine (attempts reset, no backoff): after fixing the cause
  skip    give up on events, with a mandatory --reason that is recorded with your
          name and the time; their aggregates move on to the next event. Consumers
          never see a skipped event, so skipping breaks that aggregate's order on
          purpose: prefer retry when the cause can be fixed.
  audit   the operator audit: every retry, skip and replay, newest first, with
          who (--actor and the database user), when, why (--reason) and what.
  retrying  the events that failed and will be tried again (not quarantined yet)
  errors  dead letters and retrying events grouped by the cause of their error

--destination NAME (list, show, retry, skip) works on the dead letters of one
destination of a relay with destinations (pgoutbox destinations list): each is
the event a lane of that destination stopped at, and holds back that lane for
that destination alone. retry lifts the lane's quarantine; skip moves the lane
past the event for that destination only (the others keep their own progress),
audited like any skip. Without it, dlq works on the outbox's dead letters, which
with destinations are the events routed to no destination (or refused for all).

--tenants (list, show, retry, skip) works across the outbox schemas it selects
(names and globs, '*' for all) instead of --schema. list shows every selected
tenant's dead letters with a tenant column; show finds the tenant holding the
event. retry and skip with event ids act on each id in the one tenant that holds
it (refused if an id is in none or several, or a tenant cannot be read), one
transaction and one audit row per tenant; retry with a filter or --all needs a
selector that matches exactly one tenant. audit reads one outbox (--schema).`,
		Example: `  pgoutbox dlq list --aggregate-type order
  pgoutbox dlq show 0190f1c2-7b1e-7c3a-9f00-5d2a1e4b8c11
  pgoutbox dlq retry --error-contains "schema registry"
  pgoutbox dlq skip 0190f1c2-7b1e-7c3a-9f00-5d2a1e4b8c11 --reason "refund issued by hand, TICKET-1234"
  pgoutbox dlq list --destination analytics
  pgoutbox dlq skip 0190f1c2-7b1e-7c3a-9f00-5d2a1e4b8c11 --destination partner-webhook --reason "partner refunded by hand"
  pgoutbox dlq list --tenants '*'
  pgoutbox dlq retry 0190f1c2-7b1e-7c3a-9f00-5d2a1e4b8c11 --tenants 'tenant_*'`,
		RunE: func(c *cobra.Command, _ []string) error { return c.Help() },
	}
	cmd.AddCommand(newDLQListCmd(), newDLQShowCmd(), newDLQRetryCmd(), newDLQSkipCmd(), newDLQAuditCmd(),
		newDLQRetryingCmd(), newDLQErrorsCmd())
	return cmd
}

// operatorFlags say who acts and why, for the operator audit (retry, replay; skip
// has its own mandatory --reason).
type operatorFlags struct{ actor, reason string }

func (o *operatorFlags) register(fs *pflag.FlagSet, doing string) {
	fs.StringVar(&o.reason, "reason", "", "why you are "+doing+", recorded in the operator audit (default \""+admin.DefaultReason+"\")")
	fs.StringVar(&o.actor, "actor", "", "who is "+doing+", recorded in the operator audit with the database user (env PGOUTBOX_ACTOR) (default <os user>@<hostname>)")
}

// dlqFilterFlags are the flags that select quarantined events.
type dlqFilterFlags struct{ f admin.Filter }

func (d *dlqFilterFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&d.f.AggregateType, "aggregate-type", "", "only events of this aggregate type")
	fs.StringVar(&d.f.AggregateID, "aggregate-id", "", "only events of this aggregate id")
	fs.StringVar(&d.f.EventType, "event-type", "", "only events of this event type")
	fs.StringVar(&d.f.ErrorContains, "error-contains", "", "only events whose last error contains this text (any case)")
}

func (d *dlqFilterFlags) set() bool {
	return d.f.AggregateType != "" || d.f.AggregateID != "" || d.f.EventType != "" || d.f.ErrorContains != ""
}

func dlqLimit(n int) error {
	if n < 0 {
		return usagef("--limit must not be negative, got %d", n)
	}
	return nil
}

// dlqParseIDs reads event ids from the command line.
func dlqParseIDs(args []string) ([]pgoutbox.UUID, error) {
	var out []pgoutbox.UUID
	for _, a := range args {
		id, err := pgoutbox.ParseUUID(a)
		if err != nil {
			return nil, usagef("%q is not an event id (a UUID like 0190f1c2-7b1e-7c3a-9f00-5d2a1e4b8c11)", a)
		}
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out, nil
}

func dlqPlural(n int, one string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %ss", n, one)
}

func dlqWriteJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", visible.Block(string(b)))
	return err
}

// printList writes items to out: with asJSON as a JSON array (never null);
// otherwise empty when there are none, or a table of header (tab-separated
// columns) and one row a item, written by row. It reports whether it wrote a
// table, after which the caller may add a summary line.
func printList[T any](out io.Writer, asJSON bool, items []T, empty, header string, row func(io.Writer, T)) (table bool, err error) {
	if asJSON {
		if items == nil {
			items = []T{}
		}
		return false, dlqWriteJSON(out, items)
	}
	if len(items) == 0 {
		_, err := fmt.Fprintln(out, empty)
		return false, err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, it := range items {
		row(tw, it)
	}
	return true, tw.Flush()
}

func dlqTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func newDLQListCmd() *cobra.Command {
	var db dbFlags
	var filter dlqFilterFlags
	var asJSON bool
	var tenants tenantFlags
	var dest destinationFlag
	var after string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List quarantined events, oldest quarantine first",
		Long: `List the dead letters, oldest quarantine first, a page of --limit at a time: when
a page is full, its summary line gives the --after that lists the next one (with
--json, the last event's quarantined_at and event_id, joined by a comma).
--limit 0 lists all of the outbox's at once; a destination's are always paged
(--limit 1..` + strconv.Itoa(admin.MaxPage) + `).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := dlqLimit(filter.f.Limit); err != nil {
				return err
			}
			on, err := dest.parse("dlq list", cmd.Flags())
			if err != nil {
				return err
			}
			page, paged, err := dlqListPage(filter.f.Limit, after, on)
			if err != nil {
				return err
			}
			if many, err := tenants.parse(cmd.Flags()); err != nil || many {
				if err == nil && after != "" {
					err = usagef("dlq list: --after and --tenants cannot be combined: pages go through one outbox (--schema)")
				}
				if err != nil {
					return err
				}
				return runDLQListTenants(cmd, &db, &tenants, filter.f, asJSON)
			}
			return withAdmin(cmd, &db, func(ctx context.Context, a *admin.Admin) error {
				var evs []admin.Event
				var err error
				summary, empty := "quarantined event", "no quarantined events"
				switch {
				case on:
					summary, empty = "dead letter", "no dead letters of destination "+dest.name
					evs, err = a.ListDestinationQuarantinedPage(ctx, dest.name, filter.f, page)
				case paged:
					evs, err = a.ListQuarantinedPage(ctx, filter.f, page)
				default:
					evs, err = a.ListQuarantined(ctx, filter.f)
				}
				if err != nil {
					return err
				}
				summary = dlqPlural(len(evs), summary)
				if on {
					summary += " of destination " + dest.name
				}
				return writeDLQList(cmd.OutOrStdout(), asJSON, evs, empty, summary, filter.f.Limit, paged)
			})
		},
	}
	db.register(cmd.Flags())
	filter.register(cmd.Flags())
	cmd.Flags().IntVar(&filter.f.Limit, "limit", 100, "most events listed, 0 for all (env PGOUTBOX_DLQ_LIMIT)")
	cmd.Flags().StringVar(&after, "after", "", "list the page after this position, as a full page's summary line gives it: <quarantined at>,<event id>")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array instead of a table (env PGOUTBOX_JSON)")
	tenants.register(cmd.Flags(), "lists their dead letters together with a tenant column")
	dest.register(cmd.Flags(), dlqDestinationUsage)
	return cmd
}

// dlqListPage reads dlq list's --limit and --after: a page of 1..admin.MaxPage
// events after a position. Paged lists (a destination's always, the outbox's
// while --limit is in that range) are in (quarantine, event id) order, so that
// --after goes on exactly where a page ended; --limit 0 (all), or above the
// range, lists the outbox's at once. It reports whether the list is paged.
func dlqListPage(limit int, after string, dest bool) (admin.Page, bool, error) {
	p := admin.Page{Limit: limit}
	inRange := limit >= 1 && limit <= admin.MaxPage
	switch {
	case !inRange && dest:
		return p, false, usagef("dlq list --destination: --limit must be in 1..%d (go on with --after), got %d", admin.MaxPage, limit)
	case !inRange && after != "":
		return p, false, usagef("dlq list: --after needs --limit in 1..%d, got %d", admin.MaxPage, limit)
	case !inRange:
		return p, false, nil
	case after == "":
		return p, true, nil
	}
	at, id, _ := strings.Cut(after, ",")
	var err error
	if p.After.At, err = time.Parse(time.RFC3339Nano, at); err == nil {
		p.After.ID, err = pgoutbox.ParseUUID(id)
	}
	if err != nil {
		return p, false, usagef("--after %.80q: want <quarantined at, RFC 3339>,<event id>, as a full page's summary line gives it", after)
	}
	return p, true, nil
}

// writeDLQList prints dead letters as dlq list does, then (as a table) the
// summary line, with where the next page starts when a paged list filled
// its page of limit.
func writeDLQList(out io.Writer, asJSON bool, evs []admin.Event, empty, summary string, limit int, paged bool) error {
	table, err := printList(out, asJSON, evs, empty,
		"EVENT ID\tAGGREGATE\tSEQ\tEVENT TYPE\tATTEMPTS\tQUARANTINED AT\tLAST ERROR",
		func(w io.Writer, e admin.Event) {
			fmt.Fprintf(w, "%s\t%s/%s\t%d\t%s\t%d\t%s\t%s\n", e.ID, visible.Line(e.AggregateType), visible.Line(e.AggregateID),
				e.AggregateSequence, visible.Line(e.EventType), e.AttemptCount, dlqTime(e.QuarantinedAt), dlqShorten(e.LastError, 80))
		})
	if err != nil || !table {
		return err
	}
	if last := evs[len(evs)-1]; limit > 0 && len(evs) == limit {
		if paged && last.QuarantinedAt != nil {
			summary += fmt.Sprintf(" (a page of %d; the next: --after %s,%s)", limit, last.QuarantinedAt.UTC().Format(time.RFC3339Nano), last.ID)
		} else {
			summary += fmt.Sprintf(" (the first %d; raise --limit for more)", limit)
		}
	}
	_, err = fmt.Fprintln(out, summary)
	return err
}

// tenantEvent is an event and the tenant (outbox schema) that holds it.
type tenantEvent struct {
	Tenant string `json:"tenant"`
	admin.Event
}

// runDLQListTenants is dlq list --tenants: the dead letters of every tenant,
// oldest quarantine first, --limit over them all.
func runDLQListTenants(cmd *cobra.Command, db *dbFlags, tf *tenantFlags, f admin.Filter, asJSON bool) error {
	ctx := cmd.Context()
	pool, err := db.openPool(ctx, tenantConcurrency)
	if err != nil {
		return err
	}
	defer pool.Close()
	per, err := admin.QuarantinedAll(ctx, pool, tf.sel, f, &admin.TenantsConfig{Concurrency: tenantConcurrency, Trust: tf.trust})
	if err != nil {
		return err
	}
	if len(per) == 0 {
		return noTenantMatches(tf.sel)
	}
	var evs []tenantEvent
	var failed []string
	for _, t := range per {
		if t.Err != nil {
			failed = append(failed, fmt.Sprintf("tenant %s: %s", tenantName(t.Tenant), errLine(t.Err)))
		}
		for _, e := range t.Events {
			evs = append(evs, tenantEvent{Tenant: t.Tenant, Event: e})
		}
	}
	// Each tenant's list is in order already; the stable sort keeps it.
	slices.SortStableFunc(evs, func(a, b tenantEvent) int {
		return cmp.Or(a.QuarantinedAt.Compare(*b.QuarantinedAt), cmp.Compare(a.Tenant, b.Tenant))
	})
	if f.Limit > 0 && len(evs) > f.Limit {
		evs = evs[:f.Limit]
	}
	out := cmd.OutOrStdout()
	table, err := printList(out, asJSON, evs, "no quarantined events",
		"TENANT\tEVENT ID\tAGGREGATE\tSEQ\tEVENT TYPE\tATTEMPTS\tQUARANTINED AT\tLAST ERROR",
		func(w io.Writer, e tenantEvent) {
			fmt.Fprintf(w, "%s\t%s\t%s/%s\t%d\t%s\t%d\t%s\t%s\n", tenantName(e.Tenant), e.ID, visible.Line(e.AggregateType),
				visible.Line(e.AggregateID), e.AggregateSequence, visible.Line(e.EventType), e.AttemptCount, dlqTime(e.QuarantinedAt),
				dlqShorten(e.LastError, 80))
		})
	if err != nil {
		return err
	}
	if table {
		summary := dlqPlural(len(evs), "quarantined event") + " in " + dlqPlural(len(per), "tenant")
		if f.Limit > 0 && len(evs) == f.Limit {
			summary += fmt.Sprintf(" (the first %d; raise --limit for more)", f.Limit)
		}
		if _, err := fmt.Fprintln(out, summary); err != nil {
			return err
		}
	}
	if len(failed) > 0 {
		for _, msg := range failed {
			fmt.Fprintf(cmd.ErrOrStderr(), "pgoutbox: %s\n", msg)
		}
		return fmt.Errorf("dlq list: %d of %d tenants could not be read", len(failed), len(per))
	}
	return nil
}

// dlqShorten keeps error texts on one table line, their hidden characters
// escaped.
func dlqShorten(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		s = string(r[:n-1]) + "…"
	}
	return visible.Line(s)
}

func newDLQShowCmd() *cobra.Command {
	var db dbFlags
	var asJSON bool
	var tenants tenantFlags
	var dest destinationFlag
	cmd := &cobra.Command{
		Use:   "show EVENT_ID",
		Short: "Show one event (any state) with its payload, headers and last error",
		Args: func(c *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("%s takes one event id, got %d arguments", c.CommandPath(), len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ids, err := dlqParseIDs(args)
			if err != nil {
				return err
			}
			if on, err := dest.parse("dlq show", cmd.Flags()); err != nil || on {
				if err != nil {
					return err
				}
				return withAdmin(cmd, &db, func(ctx context.Context, a *admin.Admin) error {
					e, err := a.GetForDestination(ctx, dest.name, ids[0])
					if err != nil {
						return err
					}
					if asJSON {
						return dlqWriteJSON(cmd.OutOrStdout(), e)
					}
					fmt.Fprintf(cmd.OutOrStdout(), "destination  %s\n", e.Destination)
					return dlqWriteEvent(cmd.OutOrStdout(), e)
				})
			}
			many, err := tenants.parse(cmd.Flags())
			if err != nil {
				return err
			}
			if many {
				found, err := findTenants(cmd.Context(), &db, &tenants, ids)
				if err != nil {
					return err
				}
				db.schema = found[0].Tenant
			}
			return withAdmin(cmd, &db, func(ctx context.Context, a *admin.Admin) error {
				e, err := a.Get(ctx, ids[0])
				if err != nil {
					return err
				}
				switch {
				case asJSON && many:
					return dlqWriteJSON(cmd.OutOrStdout(), tenantEvent{Tenant: db.schema, Event: *e})
				case asJSON:
					return dlqWriteJSON(cmd.OutOrStdout(), e)
				case many:
					fmt.Fprintf(cmd.OutOrStdout(), "tenant  %s\n", tenantName(db.schema))
				}
				return dlqWriteEvent(cmd.OutOrStdout(), e)
			})
		},
	}
	db.register(cmd.Flags())
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of text (env PGOUTBOX_JSON)")
	tenants.register(cmd.Flags(), "finds the one that holds the event")
	dest.register(cmd.Flags(), dlqDestinationUsage)
	return cmd
}

// dlqWriteEvent writes e as text. Every producer-controlled text goes through
// visible: no terminal escape, bidi override or line break of theirs reaches
// the terminal raw.
func dlqWriteEvent(w io.Writer, e *admin.Event) error {
	v := visible.Line
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "event id\t%s\n", e.ID)
	fmt.Fprintf(tw, "aggregate\t%s/%s, sequence %d\n", v(e.AggregateType), v(e.AggregateID), e.AggregateSequence)
	fmt.Fprintf(tw, "event type\t%s (schema version %d)\n", v(e.EventType), e.SchemaVersion)
	fmt.Fprintf(tw, "state\t%s\n", e.State)
	fmt.Fprintf(tw, "occurred at\t%s\n", dlqTime(&e.OccurredAt))
	fmt.Fprintf(tw, "available at\t%s\n", dlqTime(&e.AvailableAt))
	if e.ClaimedBy != "" {
		fmt.Fprintf(tw, "claimed by\t%s until %s\n", v(e.ClaimedBy), dlqTime(e.ClaimUntil))
	}
	fmt.Fprintf(tw, "published at\t%s\n", dlqTime(e.PublishedAt))
	fmt.Fprintf(tw, "attempts\t%d\n", e.AttemptCount)
	fmt.Fprintf(tw, "quarantined at\t%s\n", dlqTime(e.QuarantinedAt))
	lastErr := e.LastError
	if lastErr == "" {
		lastErr = "-"
	}
	fmt.Fprintf(tw, "last error\t%s\n", v(strings.Join(strings.Fields(lastErr), " ")))
	if s := e.Skip; s != nil {
		fmt.Fprintf(tw, "skipped\tby %s (database user %s) at %s\n", v(s.SkippedBy), v(s.DBUser), dlqTime(&s.SkippedAt))
		fmt.Fprintf(tw, "skip reason\t%s\n", v(s.Reason))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(e.Attempts) > 0 {
		fmt.Fprintln(w, "failed attempts, newest first:")
		for _, a := range e.Attempts {
			where := v(a.RelayID)
			if a.Destination != "" {
				where += " to " + v(a.Destination)
			}
			fmt.Fprintf(w, "  #%d  %s (%s ago)  %s: %s\n", a.Attempt, dlqTime(&a.At), time.Duration(a.Age).Round(time.Second),
				where, v(strings.Join(strings.Fields(a.Error), " ")))
		}
	}
	if len(e.Headers) > 0 {
		fmt.Fprintln(w, "headers:")
		for _, k := range slices.Sorted(maps.Keys(e.Headers)) {
			fmt.Fprintf(w, "  %s: %s\n", v(k), v(e.Headers[k]))
		}
	}
	fmt.Fprintln(w, "payload:")
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, e.Payload, "", "  "); err != nil {
		pretty.Reset()
		pretty.Write(e.Payload)
	}
	_, err := fmt.Fprintf(w, "%s\n", visible.Block(pretty.String()))
	return err
}

func newDLQRetryCmd() *cobra.Command {
	var db dbFlags
	var tenants tenantFlags
	var filter dlqFilterFlags
	var all bool
	var op operatorFlags
	var dest destinationFlag
	cmd := &cobra.Command{
		Use:   "retry (EVENT_ID... | --all | filter flags)",
		Short: "Lift the quarantine of events: attempts reset, no backoff, relays woken",
		Long: `Give quarantined events a fresh start: the quarantine is lifted, the attempt count
reset and the backoff cleared, and the relays are woken. Each aggregate's lane then
resumes from the retried event, in sequence order. The last error is kept.

Say which events: their ids, a filter (--aggregate-type, --aggregate-id,
--event-type, --error-contains; --limit caps it), or --all. Ids that are not
quarantined are left alone and reported; an id no event has is "not found"
(exit status 1) and then nothing is retried. The retry is recorded in the
operator audit (pgoutbox dlq audit) with --actor, --reason, the database user and
the time.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := dlqLimit(filter.f.Limit); err != nil {
				return err
			}
			ids, err := dlqParseIDs(args)
			if err != nil {
				return err
			}
			ways := 0
			for _, b := range []bool{len(ids) > 0, all, filter.set()} {
				if b {
					ways++
				}
			}
			switch {
			case ways == 0:
				return usagef("dlq retry: say which events: event ids, a filter (--aggregate-type, --aggregate-id, --event-type, --error-contains) or --all")
			case ways > 1:
				return usagef("dlq retry: give event ids, a filter or --all, not several of them")
			case filter.f.Limit > 0 && !filter.set():
				return usagef("dlq retry: --limit goes with a filter")
			}
			if on, err := dest.parse("dlq retry", cmd.Flags()); err != nil || on {
				if err != nil {
					return err
				}
				return dlqRetryDestination(cmd, &db, admin.DestinationRetryRequest{Destination: dest.name, IDs: ids, All: all,
					Filter: filter.f, Actor: op.actor, Reason: op.reason})
			}
			groups, many, err := dlqTenantGroups(cmd, &db, &tenants, ids, "dlq retry with a filter or --all")
			if err != nil {
				return err
			}
			return dlqInTenants(cmd, &db, groups, many, "retry", func(g admin.TenantIDs) error {
				return dlqRetryIn(cmd, &db, admin.RetryRequest{IDs: g.IDs, All: all, Filter: filter.f,
					Actor: op.actor, Reason: op.reason}, many)
			})
		},
	}
	db.register(cmd.Flags())
	filter.register(cmd.Flags())
	cmd.Flags().IntVar(&filter.f.Limit, "limit", 0, "with a filter, retry at most this many events, oldest quarantine first (0: all that match)")
	cmd.Flags().BoolVar(&all, "all", false, "retry every quarantined event")
	op.register(cmd.Flags(), "retrying")
	tenants.register(cmd.Flags(), "with event ids, each id is retried in the one tenant holding it; with a filter or --all, it must match one tenant")
	dest.register(cmd.Flags(), dlqDestinationUsage)
	return cmd
}

// dlqTenantGroups resolves --tenants for a state-changing dlq verb: with event
// ids, each id goes to the one selected tenant holding it (several tenants
// possible); without, the selector must match exactly one tenant. Without
// --tenants it is --schema with ids as given. many reports --tenants.
func dlqTenantGroups(cmd *cobra.Command, db *dbFlags, tf *tenantFlags, ids []pgoutbox.UUID, verb string) (groups []admin.TenantIDs, many bool, err error) {
	many, err = tf.parse(cmd.Flags())
	switch {
	case err != nil:
		return nil, false, err
	case !many:
		return []admin.TenantIDs{{Tenant: db.schema, IDs: ids}}, false, nil
	case len(ids) > 0:
		groups, err = findTenants(cmd.Context(), db, tf, ids)
		return groups, true, err
	}
	tenant, err := oneTenant(cmd.Context(), db, tf, verb, ", or give event ids")
	return []admin.TenantIDs{{Tenant: tenant}}, true, err
}

// dlqInTenants runs fn in each group's tenant in turn (db.schema set to it).
// With --tenants (many), a tenant found stuck (its statements ended at their
// lock bound: admin.ErrTenantStuck) is reported on stderr by name and skipped,
// the others are acted on, and the error at the end counts the stuck ones; any
// other error stops at once, as without --tenants.
func dlqInTenants(cmd *cobra.Command, db *dbFlags, groups []admin.TenantIDs, many bool, verb string, fn func(admin.TenantIDs) error) error {
	var stuck []string
	for _, g := range groups {
		db.schema = g.Tenant
		err := fn(g)
		if many && errors.Is(err, admin.ErrTenantStuck) {
			stuck = append(stuck, g.Tenant)
			fmt.Fprintf(cmd.ErrOrStderr(), "tenant %s: %s\n", tenantName(g.Tenant), errLine(err))
			continue
		}
		if err != nil {
			return err
		}
	}
	if len(stuck) > 0 {
		return fmt.Errorf("dlq %s: %d of %d tenants were stuck and left as they were (%s): %w; the others were done",
			verb, len(stuck), len(groups), tenantList(stuck), admin.ErrTenantStuck)
	}
	return nil
}

// notRetried returns the ids asked for that are not among those retried.
func notRetried(asked, retried []pgoutbox.UUID) []string {
	var left []string
	for _, id := range asked {
		if !slices.Contains(retried, id) {
			left = append(left, id.String())
		}
	}
	return left
}

// dlqRetryIn runs one retry in the outbox of db.schema and prints its summary,
// naming the tenant when many.
func dlqRetryIn(cmd *cobra.Command, db *dbFlags, req admin.RetryRequest, many bool) error {
	retried, err := dlqActIn(cmd, db, many, func(ctx context.Context, a *admin.Admin) ([]pgoutbox.UUID, error) {
		return a.RetryEvents(ctx, req)
	})
	if err != nil {
		return err
	}
	left := notRetried(req.IDs, retried)
	summary := "retried " + dlqPlural(len(retried), "event")
	if len(left) > 0 {
		summary += "; not quarantined, left alone: " + strings.Join(left, ", ")
	}
	_, err = fmt.Fprintln(cmd.OutOrStdout(), dlqTenantPrefix(db, many)+summary)
	return err
}

func newDLQSkipCmd() *cobra.Command {
	var db dbFlags
	var tenants tenantFlags
	var reason, actor string
	var dest destinationFlag
	cmd := &cobra.Command{
		Use:   "skip EVENT_ID... --reason TEXT",
		Short: "Give up on quarantined events, with a recorded reason; their aggregates move on",
		Long: `Mark quarantined events as published without sending them, so that the later
events of their aggregates are published. Consumers never see a skipped event:
skipping breaks that aggregate's order on purpose, so it needs a --reason, which
is recorded in outbox_skipped_events with --actor, the database user and the time.

Only quarantined events can be skipped; if any id is not, nothing is skipped.`,
		Args: func(c *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("%s needs the ids of the events to skip", c.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(reason) == "" {
				return usagef("dlq skip needs --reason: say why these events may be dropped (it is recorded)")
			}
			ids, err := dlqParseIDs(args)
			if err != nil {
				return err
			}
			if on, err := dest.parse("dlq skip", cmd.Flags()); err != nil || on {
				if err != nil {
					return err
				}
				return dlqSkipDestination(cmd, &db, admin.DestinationSkipRequest{Destination: dest.name, IDs: ids, Reason: reason, Actor: actor})
			}
			groups, many, err := dlqTenantGroups(cmd, &db, &tenants, ids, "dlq skip")
			if err != nil {
				return err
			}
			if len(groups) > 1 {
				// One transaction per tenant: check them all first, so that a
				// refusal in one tenant comes before any skip in another.
				if err := dlqCheckQuarantined(cmd, db, groups); err != nil {
					return err
				}
			}
			return dlqInTenants(cmd, &db, groups, many, "skip", func(g admin.TenantIDs) error {
				return dlqSkipIn(cmd, &db, admin.SkipRequest{IDs: g.IDs, Reason: reason, Actor: actor}, many)
			})
		},
	}
	db.register(cmd.Flags())
	cmd.Flags().StringVar(&reason, "reason", "", "why the events may be dropped; required, recorded in outbox_skipped_events")
	cmd.Flags().StringVar(&actor, "actor", "", "who is skipping, recorded with the reason (env PGOUTBOX_ACTOR) (default <os user>@<hostname>)")
	tenants.register(cmd.Flags(), "each id is skipped in the one tenant holding it, audited there")
	dest.register(cmd.Flags(), dlqDestinationUsage)
	return cmd
}

// dlqCheckQuarantined refuses, before anything is skipped, ids that are not
// quarantined in their tenant.
func dlqCheckQuarantined(cmd *cobra.Command, db dbFlags, groups []admin.TenantIDs) error {
	for _, g := range groups {
		db.schema = g.Tenant
		a, closeDB, err := statusOpenAdmin(cmd.Context(), &db, "")
		if err != nil {
			return err
		}
		for _, id := range g.IDs {
			e, err := a.Get(cmd.Context(), id)
			if err == nil && e.State != admin.StateQuarantined {
				err = fmt.Errorf("event %s of tenant %s is %s: %w; nothing was skipped", id, tenantName(g.Tenant), e.State, admin.ErrNotQuarantined)
			}
			if err != nil {
				closeDB()
				return err
			}
		}
		closeDB()
	}
	return nil
}

// dlqActIn runs act, an audited dlq action, on the Admin of db.schema (a
// tenant's, bounded by its lock timeout, when many): an invalid audit text is
// a usage error, any other failure marks the tenant stuck when it is
// (admin.TenantStuck).
func dlqActIn[T any](cmd *cobra.Command, db *dbFlags, many bool, act func(context.Context, *admin.Admin) (T, error)) (T, error) {
	var none T
	a, closeDB, err := tenantOpenAdmin(cmd.Context(), db, many)
	if err != nil {
		return none, err
	}
	defer closeDB()
	res, err := act(cmd.Context(), a)
	if errors.Is(err, admin.ErrInvalidAuditText) {
		return none, usageError{err}
	}
	if err != nil {
		return none, admin.TenantStuck(err)
	}
	return res, nil
}

// dlqTenantPrefix names the tenant of db.schema before a summary line when
// many, else nothing.
func dlqTenantPrefix(db *dbFlags, many bool) string {
	if !many {
		return ""
	}
	return "tenant " + tenantName(db.schema) + ": "
}

// dlqSkipIn runs one skip in the outbox of db.schema and prints its summary,
// naming the tenant when many.
func dlqSkipIn(cmd *cobra.Command, db *dbFlags, req admin.SkipRequest, many bool) error {
	skipped, err := dlqActIn(cmd, db, many, func(ctx context.Context, a *admin.Admin) ([]admin.Skipped, error) {
		return a.Skip(ctx, req)
	})
	if err != nil {
		return err
	}
	var lanes []string
	for _, s := range skipped {
		lanes = append(lanes, fmt.Sprintf("%s/%s #%d", s.AggregateType, s.AggregateID, s.AggregateSequence))
	}
	by := req.Actor
	if len(skipped) > 0 {
		by = skipped[0].SkippedBy
	}
	_, err = fmt.Fprintf(cmd.OutOrStdout(), "%sskipped %s (%s) as %s\n", dlqTenantPrefix(db, many), dlqPlural(len(skipped), "event"), strings.Join(lanes, ", "), by)
	return err
}

func newDLQAuditCmd() *cobra.Command {
	var db dbFlags
	var limit int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Show the operator audit: recent retries, skips and replays, newest first",
		Long: `Every dlq retry, dlq skip and replay writes a row in outbox_operator_audit in the
transaction that does it (a replay: before it publishes, with its outcome when it
ends): who (--actor as given and the database user), when, why (--reason) and
what (the selection, the events and their count).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 1 {
				return usagef("--limit must be positive, got %d", limit)
			}
			return withAdmin(cmd, &db, func(ctx context.Context, a *admin.Admin) error {
				entries, err := a.Audit(ctx, limit)
				if err != nil {
					return err
				}
				_, err = printList(cmd.OutOrStdout(), asJSON, entries, "no operator actions recorded",
					"AT\tACTION\tACTOR\tDB USER\tEVENTS\tSELECTION\tREASON",
					func(w io.Writer, e admin.AuditEntry) {
						sel, _ := json.Marshal(e.Selection)
						fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", e.At.UTC().Format(time.RFC3339), e.Action, visible.Line(e.Actor), visible.Line(e.DBUser),
							e.EventCount, dlqShorten(string(sel), 60), dlqShorten(e.Reason, 60))
					})
				return err
			})
		},
	}
	db.register(cmd.Flags())
	cmd.Flags().IntVar(&limit, "limit", 50, "most rows shown, newest first")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array instead of a table (env PGOUTBOX_JSON)")
	return cmd
}

// dlqRetryDestination is dlq retry --destination.
func dlqRetryDestination(cmd *cobra.Command, db *dbFlags, req admin.DestinationRetryRequest) error {
	retried, err := dlqActIn(cmd, db, false, func(ctx context.Context, a *admin.Admin) ([]pgoutbox.UUID, error) {
		return a.RetryDestination(ctx, req)
	})
	if err != nil {
		return err
	}
	left := notRetried(req.IDs, retried)
	summary := "retried " + dlqPlural(len(retried), "dead letter") + " of destination " + req.Destination
	if len(left) > 0 {
		summary += "; not its dead letters, left alone: " + strings.Join(left, ", ")
	}
	_, err = fmt.Fprintln(cmd.OutOrStdout(), summary)
	return err
}

// dlqSkipDestination is dlq skip --destination.
func dlqSkipDestination(cmd *cobra.Command, db *dbFlags, req admin.DestinationSkipRequest) error {
	skipped, err := dlqActIn(cmd, db, false, func(ctx context.Context, a *admin.Admin) ([]admin.Event, error) {
		return a.SkipDestination(ctx, req)
	})
	if err != nil {
		return err
	}
	var lanes []string
	for _, e := range skipped {
		lanes = append(lanes, fmt.Sprintf("%s/%s #%d", visible.Line(e.AggregateType), visible.Line(e.AggregateID), e.AggregateSequence))
	}
	_, err = fmt.Fprintf(cmd.OutOrStdout(), "skipped %s for destination %s (%s)\n", dlqPlural(len(skipped), "event"), req.Destination, strings.Join(lanes, ", "))
	return err
}
