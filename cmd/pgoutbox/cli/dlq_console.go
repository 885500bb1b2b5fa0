package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/internal/visible"
)

// The command-line twins of the console's retrying view and errors by cause
// (admin/adminhttp): the same data, as a table or --json.

// writeSplit prints the pending events split into those waiting for a relay
// and those blocked behind a dead letter, with the oldest age of each.
func writeSplit(w io.Writer, st *admin.Status) {
	age := func(n int64, d admin.Duration) string {
		if n == 0 {
			return ""
		}
		return "\t(oldest " + statusAge(time.Duration(d)) + ")"
	}
	fmt.Fprintf(w, "  waiting for a relay\t%d%s\n", st.WaitingForRelay, age(st.WaitingForRelay, st.OldestWaitingForRelayAge))
	fmt.Fprintf(w, "  blocked behind dead letters\t%d%s\n", st.BlockedBehindDeadLetter, age(st.BlockedBehindDeadLetter, st.OldestBlockedAge))
}

func newDLQRetryingCmd() *cobra.Command {
	var db dbFlags
	var limit int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "retrying",
		Short: "List the events that failed and will be tried again (not quarantined yet)",
		Long: `The events a relay failed to publish that are neither published nor quarantined:
with their attempts, next attempt and last error, oldest first. The console's
"Retrying" page; --json prints the same as its /api/v1/retrying.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 1 || limit > admin.MaxPage {
				return usagef("--limit must be in 1..%d, got %d", admin.MaxPage, limit)
			}
			return withAdmin(cmd, &db, func(ctx context.Context, a *admin.Admin) error {
				evs, err := a.ListRetrying(ctx, admin.Page{Limit: limit})
				if err != nil {
					return err
				}
				_, err = printList(cmd.OutOrStdout(), asJSON, evs, "no event is retrying",
					"EVENT\tAGGREGATE\tSEQ\tATTEMPTS\tNEXT ATTEMPT\tLAST ERROR",
					func(w io.Writer, e admin.Event) {
						fmt.Fprintf(w, "%s\t%s/%s\t%d\t%d\t%s\t%s\n", e.ID, visible.Line(e.AggregateType), visible.Line(e.AggregateID),
							e.AggregateSequence, e.AttemptCount, e.AvailableAt.UTC().Format(time.RFC3339), dlqShorten(e.LastError, 80))
					})
				return err
			})
		},
	}
	db.register(cmd.Flags())
	cmd.Flags().IntVar(&limit, "limit", 100, "most events shown")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array instead of a table (env PGOUTBOX_JSON)")
	return cmd
}

func newDLQErrorsCmd() *cobra.Command {
	var db dbFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "errors",
		Short: "Group dead letters and retrying events by the cause of their last error",
		Long: `Dead letters and retrying events grouped by a normalised signature of their last
error (ids, numbers and URLs folded; the receiver's answer first), with counts,
first and last seen and the aggregates affected: the console's "Errors by
cause" page; --json prints the same as its /api/v1/errors. Retry or skip a
group from the console (or dlq retry --error-contains).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withAdmin(cmd, &db, func(ctx context.Context, a *admin.Admin) error {
				gs, err := a.ErrorGroups(ctx)
				if err != nil {
					return err
				}
				if asJSON {
					return dlqWriteJSON(cmd.OutOrStdout(), gs)
				}
				table, err := printList(cmd.OutOrStdout(), false, gs.Groups, "no failing event",
					"GROUP\tDEAD\tRETRYING\tAGGREGATES\tFIRST SEEN\tLAST SEEN\tCAUSE",
					func(w io.Writer, g admin.ErrorGroup) {
						fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%s\t%s\t%s\n", g.ID, g.DeadLetters, g.Retrying, g.Aggregates,
							g.FirstSeen.UTC().Format(time.RFC3339), g.LastSeen.UTC().Format(time.RFC3339), dlqShorten(g.Signature.String(), 100))
					})
				if err == nil && table && gs.Truncated {
					_, err = fmt.Fprintf(cmd.OutOrStdout(), "only the oldest %d failed events were grouped\n", gs.Events)
				}
				return err
			})
		},
	}
	db.register(cmd.Flags())
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table (env PGOUTBOX_JSON)")
	return cmd
}
