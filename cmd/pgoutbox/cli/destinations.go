package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/relay"
)

// The destinations of relays with destinations (--destinations-file;
// docs/operations.md, "Destinations"): list and drop, and dlq --destination.

func newDestinationsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "destinations",
		Short: "List the destinations of relays with destinations, or drop one",
		Long: `A relay started with --destinations-file registers each destination in the
outbox (outbox_destinations) and keeps its progress per aggregate lane
(outbox_destination_lanes). A destination removed from the file keeps its progress,
so adding it back resumes where it was; drop forgets it.

  list    the destinations: rules, start, registration, pending lanes and events,
          dead letters (pgoutbox dlq list --destination NAME), oldest pending age
  drop    forget a destination: its progress and its row, audited with --reason.
          A relay that names it again starts it over by its start: "now" skips
          what was committed before, "backfill" sends every retained event again.

Per destination: pgoutbox dlq list|show|retry|skip --destination NAME (its dead
letters) and pgoutbox replay --destination NAME (re-publish to it alone).`,
		Example: `  pgoutbox destinations list
  pgoutbox destinations drop analytics --reason "analytics moved to the new cluster, TICKET-42"`,
		RunE: func(c *cobra.Command, _ []string) error { return c.Help() },
	}
	cmd.AddCommand(newDestinationsListCmd(), newDestinationsDropCmd())
	return cmd
}

func newDestinationsListCmd() *cobra.Command {
	var db dbFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the destinations with their backlog and dead letters",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withAdmin(cmd, &db, func(ctx context.Context, a *admin.Admin) error {
				ds, err := a.Destinations(ctx)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				if asJSON {
					return dlqWriteJSON(out, ds)
				}
				if len(ds) == 0 {
					_, err := fmt.Fprintln(out, "no destinations (a relay registers them with --destinations-file)")
					return err
				}
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "DESTINATION\tSTART\tREGISTERED\tRULES UPDATED\tPENDING LANES\tPENDING EVENTS\tDEAD LETTERS\tOLDEST PENDING\tRULES")
				for _, d := range ds {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", d.Name, d.Start, d.RegisteredAt.UTC().Format(time.RFC3339),
						d.UpdatedAt.UTC().Format(time.RFC3339), d.PendingLanes, d.PendingEvents, d.DeadLetters, destinationAge(d),
						dlqShorten(string(d.Rules), 80))
				}
				return tw.Flush()
			})
		},
	}
	db.register(cmd.Flags())
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array instead of a table (env PGOUTBOX_JSON)")
	return cmd
}

// destinationAge is a destination's oldest pending age for people, "-" when
// nothing is pending.
func destinationAge(d admin.Destination) string {
	if d.PendingEvents == 0 {
		return "-"
	}
	return statusAge(time.Duration(d.OldestPendingAge))
}

// writeDestinations is status's table of the destinations.
func writeDestinations(tw *tabwriter.Writer, ds []admin.Destination) error {
	fmt.Fprintln(tw, "DESTINATION\tPENDING LANES\tPENDING EVENTS\tDEAD LETTERS\tOLDEST PENDING\tRULES UPDATED")
	for _, d := range ds {
		dead := fmt.Sprint(d.DeadLetters)
		if d.DeadLetters > 0 {
			dead += " (pgoutbox dlq list --destination " + d.Name + ")"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", d.Name, d.PendingLanes, d.PendingEvents, dead, destinationAge(d),
			d.UpdatedAt.UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}

func newDestinationsDropCmd() *cobra.Command {
	var db dbFlags
	var op operatorFlags
	var force bool
	cmd := &cobra.Command{
		Use:   "drop NAME --reason TEXT",
		Short: "Forget a destination: its progress and its row, audited",
		Long: `Delete a destination's progress rows and its row, and record the drop in the
operator audit (action destination_drop, with its rules and start) in the same
transaction. Remove it from every relay's --destinations-file and restart them
first: while a relay holds leases on its lanes the drop is refused (--force drops
it anyway, and that relay registers it again at its next start or lease, starting
over). A destination added again after a drop starts by its start: "now" skips
what was committed before, "backfill" sends every retained event again.`,
		Args: func(c *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("%s takes one destination name, got %d arguments", c.CommandPath(), len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkDestinationFlag("destinations drop", args[0]); err != nil {
				return err
			}
			if strings.TrimSpace(op.reason) == "" {
				return usagef("destinations drop needs --reason: say why the destination's progress may be forgotten (it is recorded)")
			}
			return withAdmin(cmd, &db, func(ctx context.Context, a *admin.Admin) error {
				d, err := a.DropDestination(ctx, admin.DropRequest{Name: args[0], Reason: op.reason, Actor: op.actor, Force: force})
				switch {
				case errors.Is(err, admin.ErrInvalidAuditText):
					return usageError{err}
				case errors.Is(err, admin.ErrDestinationServed):
					return fmt.Errorf("%w (--force drops it anyway)", err)
				case err != nil:
					return err
				}
				out := cmd.OutOrStdout()
				_, err = fmt.Fprintf(out, "dropped destination %s: %s deleted, %d dead letters and %d pending events forgotten (audit %d)\n",
					d.Destination.Name, dlqPlural(int(d.Lanes), "progress row"), d.Destination.DeadLetters, d.Destination.PendingEvents, d.AuditID)
				if err != nil {
					return err
				}
				if force && d.Destination.LiveLeases > 0 {
					fmt.Fprintf(cmd.ErrOrStderr(), "pgoutbox: warning: a relay held %d leases on its lanes: it registers %s again, starting over (%s)\n",
						d.Destination.LiveLeases, d.Destination.Name, d.Destination.Start)
					return nil
				}
				// No lease now, but a running relay whose file still names it
				// would serve it again: say so.
				if relays, rerr := a.Relays(ctx); rerr == nil {
					running := 0
					for _, r := range relays {
						if r.Running() {
							running++
						}
					}
					if running > 0 {
						are := dlqPlural(running, "relay") + " are"
						if running == 1 {
							are = "1 relay is"
						}
						fmt.Fprintf(cmd.ErrOrStderr(), "pgoutbox: warning: %s running on this outbox: restart any whose --destinations-file still names %s without it, or it serves %s again from the start\n",
							are, d.Destination.Name, d.Destination.Name)
					}
				}
				return nil
			})
		},
	}
	db.register(cmd.Flags())
	op.register(cmd.Flags(), "dropping the destination")
	cmd.Flags().BoolVar(&force, "force", false, "drop it even while a relay holds leases on its lanes (no environment variable)")
	return cmd
}

// destinationFlag is dlq's --destination: the dead letters of one destination
// instead of the outbox's. Like the other selection flags of dlq it has no
// environment variable.
type destinationFlag struct{ name string }

// register adds --destination, usage saying what it does for the verb.
func (d *destinationFlag) register(fs *pflag.FlagSet, usage string) {
	fs.StringVar(&d.name, "destination", "", usage)
}

// dlqDestinationUsage is --destination's usage in the dlq verbs.
const dlqDestinationUsage = "the dead letters of this destination (pgoutbox destinations list) instead of the outbox's"

// parse checks --destination: relay.Destination's name rule, before any
// SQL, and not together with --tenants. It reports whether it was given.
func (d *destinationFlag) parse(verb string, fs *pflag.FlagSet) (bool, error) {
	if !fs.Changed("destination") {
		return false, nil
	}
	if fs.Changed("tenants") {
		return false, usagef("%s: --destination and --tenants cannot be combined: relays with destinations serve one outbox (--schema)", verb)
	}
	return true, checkDestinationFlag(verb, d.name)
}

// checkDestinationFlag refuses a destination name relay.Destination would
// refuse, as a usage error that shows at most the first 80 bytes of it.
func checkDestinationFlag(verb, name string) error {
	if err := relay.ValidateDestinationName(name); err != nil {
		return usagef("%s: %v", verb, err)
	}
	return nil
}
