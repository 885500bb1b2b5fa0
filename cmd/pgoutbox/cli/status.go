package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/internal/pgbound"
	"github.com/pgoutbox/pgoutbox/internal/visible"
	"github.com/pgoutbox/pgoutbox/migrate"
)

func newStatusCmd() *cobra.Command {
	var (
		db          dbFlags
		asJSON      bool
		watch       bool
		interval    time.Duration
		inboxSchema string
		tenants     tenantFlags
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the outbox's health: backlog, oldest pending age, dead letters, leases, sizes",
		Long: `Print a snapshot of the outbox:

  pending                events not yet published and not quarantined (waiting,
                         leased or backing off)
  oldest pending age     how long ago the oldest pending event occurred: the
                         headline figure; it grows whenever events stop flowing
  quarantined            dead letters; each blocks its aggregate's later events
                         (see "pgoutbox dlq")
  backing off            pending events waiting for their retry time
  published last minute  events the broker acknowledged in the last minute
  leases                 per relay id, live leases and expired ones (a relay that
                         died or stalled; any relay takes them over)
  tables                 disk use of the outbox tables and the consumer inbox's
                         processed_events (dedup) table

The queries read only unpublished rows and recent index ranges, so status is cheap
on a table with a long published history. --json prints the same figures as one
JSON object (durations in seconds, sizes in bytes). --watch repeats every
--interval: in place on a terminal, as successive snapshots separated by a blank
line otherwise; Ctrl-C stops it.

--tenants reads many outboxes of the database at once (4 at a time, each within
10s) and prints one row per tenant: pending, oldest pending age, quarantined,
backing off, live and expired leases, published last minute, and the error of a
tenant that could not be read (not migrated, dropped, permission denied, locked).
Rows come worst first: unreadable tenants, then by oldest pending age. --json
prints a JSON array of the same rows in the same order ("error" null or a
string). The exit status is 0 when every row was read, whatever the figures (as
without --tenants), 1 when the selector matches no outbox or some tenant could
not be read (every row is printed first).`,
		Example: `  pgoutbox status
  pgoutbox status --watch --interval 5s
  pgoutbox status --json | jq .oldest_pending_age_seconds
  pgoutbox status --tenants '*'
  pgoutbox status --tenants 'tenant_*,billing' --json | jq '.[0]'`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval <= 0 {
				return usagef("--interval must be positive, got %s", interval)
			}
			many, err := tenants.parse(cmd.Flags())
			if err != nil {
				return err
			}
			if many {
				if cmd.Flags().Changed("inbox-schema") {
					return usagef("--inbox-schema (PGOUTBOX_INBOX_SCHEMA) does not go with --tenants: each tenant's inbox is in its own schema")
				}
				return runStatusTenants(cmd.Context(), &db, &tenants, cmd.OutOrStdout(), cmd.ErrOrStderr(), asJSON, watch, interval)
			}
			if inboxSchema == "" {
				inboxSchema = db.schema
			}
			if err := migrate.ValidateSchema(inboxSchema); err != nil {
				return usagef("--inbox-schema: %v", err)
			}
			ctx := cmd.Context()
			a, closeDB, err := statusOpenAdmin(ctx, &db, inboxSchema)
			if err != nil {
				return err
			}
			defer closeDB()
			out := cmd.OutOrStdout()
			if !watch {
				st, err := a.Status(ctx)
				if err != nil {
					return err
				}
				return writeStatus(out, st, asJSON)
			}
			return watchStatus(ctx, out, cmd.ErrOrStderr(), a, interval, asJSON, progressTTY(out))
		},
	}
	db.register(cmd.Flags())
	fs := cmd.Flags()
	fs.BoolVar(&asJSON, "json", false, "print JSON instead of a table (env PGOUTBOX_JSON)")
	// No environment variable: a left-over one would turn every scripted status into an endless watch.
	fs.BoolVar(&watch, "watch", false, "refresh every --interval until Ctrl-C")
	fs.DurationVar(&interval, "interval", 2*time.Second, "refresh period of --watch (env PGOUTBOX_STATUS_INTERVAL)")
	fs.StringVar(&inboxSchema, "inbox-schema", "",
		"schema of the consumer inbox's processed_events table (env PGOUTBOX_INBOX_SCHEMA) (default --schema)")
	tenants.register(fs, "prints one row per tenant, worst first")
	return cmd
}

// statusOpenAdmin connects a small pool (it reconnects by itself, which --watch needs),
// checks that the schema is migrated and returns an Admin on it.
func statusOpenAdmin(ctx context.Context, db *dbFlags, inboxSchema string) (*admin.Admin, func(), error) {
	pool, err := db.openPool(ctx, 2)
	if err != nil {
		return nil, nil, err
	}
	a, err := adminOn(ctx, pool, db, db.schema, inboxSchema)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return a, pool.Close, nil
}

// withAdmin runs fn with an Admin on db's outbox (statusOpenAdmin), closed
// after, and the command's context.
func withAdmin(cmd *cobra.Command, db *dbFlags, fn func(context.Context, *admin.Admin) error) error {
	a, closeDB, err := statusOpenAdmin(cmd.Context(), db, "")
	if err != nil {
		return err
	}
	defer closeDB()
	return fn(cmd.Context(), a)
}

// tenantOpenAdmin is statusOpenAdmin for a verb acting on a tenant of
// --tenants (many): every statement and transaction then waits for a lock
// another session holds on the tenant's tables at most
// admin.DefaultTenantLockTimeout (pgbound.LockOnly), so that a stuck tenant
// fails at once, wrapping admin.ErrTenantStuck (admin.TenantStuck), instead of
// holding the others up.
func tenantOpenAdmin(ctx context.Context, db *dbFlags, many bool) (*admin.Admin, func(), error) {
	if !many {
		return statusOpenAdmin(ctx, db, "")
	}
	pool, err := db.openPool(ctx, 2)
	if err != nil {
		return nil, nil, err
	}
	a, err := adminOn(ctx, pgbound.LockOnly(admin.DefaultTenantLockTimeout).On(pool), db, db.schema, "")
	if err != nil {
		pool.Close()
		return nil, nil, admin.TenantStuck(err)
	}
	return a, pool.Close, nil
}

// adminOn checks that schema is migrated and returns an Admin on it.
func adminOn(ctx context.Context, pool interface {
	migrate.Querier
	admin.DB
}, db *dbFlags, schema, inboxSchema string) (*admin.Admin, error) {
	cctx, cancel := context.WithTimeout(ctx, db.connectTimeout)
	defer cancel()
	if err := checkMigrated(cctx, pool, schema); err != nil {
		return nil, err
	}
	a, err := admin.New(pool, &admin.Config{Schema: schema, InboxSchema: inboxSchema})
	if err != nil {
		return nil, usageError{err}
	}
	return a, nil
}

// ANSI: cursor home, then clear the screen.
const statusClearScreen = "\x1b[H\x1b[2J"

// watchStatus prints a snapshot every interval until ctx ends, which is a normal
// stop (nil). On a terminal each snapshot replaces the previous one; otherwise
// snapshots follow each other, separated by a blank line. A failed snapshot (the
// database restarting) is reported and the watch goes on.
func watchStatus(ctx context.Context, out, errOut io.Writer, a *admin.Admin, interval time.Duration, asJSON, tty bool) error {
	return watchSnapshots(ctx, out, errOut, interval, max(interval, 10*time.Second), tty, func(ctx context.Context) (func(io.Writer) error, error) {
		st, err := a.Status(ctx)
		if err != nil {
			return nil, err
		}
		return func(w io.Writer) error { return writeStatus(w, st, asJSON) }, nil
	})
}

// watchSnapshots is the loop of --watch: snap reads a snapshot (within timeout,
// when positive) and returns how to print it.
func watchSnapshots(ctx context.Context, out, errOut io.Writer, interval, timeout time.Duration, tty bool,
	snap func(context.Context) (func(io.Writer) error, error)) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for n := 0; ; n++ {
		qctx, cancel := ctx, context.CancelFunc(func() {})
		if timeout > 0 {
			qctx, cancel = context.WithTimeout(ctx, timeout)
		}
		write, err := snap(qctx)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		var buf bytes.Buffer
		switch {
		case tty:
			buf.WriteString(statusClearScreen)
		case n > 0 && err == nil:
			buf.WriteString("\n")
		}
		if err != nil {
			msg := "status: " + strings.Join(strings.Fields(err.Error()), " ") + " (retrying)\n"
			if tty {
				buf.WriteString(msg)
			} else {
				fmt.Fprint(errOut, "pgoutbox: "+msg)
			}
		} else if err := write(&buf); err != nil {
			return err
		}
		if tty {
			fmt.Fprintf(&buf, "\nevery %s; Ctrl-C to stop\n", interval)
		}
		if _, err := out.Write(buf.Bytes()); err != nil {
			return fmt.Errorf("write status: %w", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// runStatusTenants is status --tenants: one row per tenant (admin.StatusAll).
func runStatusTenants(ctx context.Context, db *dbFlags, tf *tenantFlags, out, errOut io.Writer, asJSON, watch bool, interval time.Duration) error {
	pool, err := db.openPool(ctx, tenantConcurrency)
	if err != nil {
		return err
	}
	defer pool.Close()
	read := func(ctx context.Context) ([]admin.TenantStatus, error) {
		rows, err := admin.StatusAll(ctx, pool, tf.sel, &admin.TenantsConfig{Concurrency: tenantConcurrency, Trust: tf.trust})
		if err == nil && len(rows) == 0 {
			err = noTenantMatches(tf.sel)
		}
		return rows, err
	}
	if watch {
		// No deadline over the whole snapshot: each tenant has its own.
		return watchSnapshots(ctx, out, errOut, interval, 0, progressTTY(out), func(ctx context.Context) (func(io.Writer) error, error) {
			rows, err := read(ctx)
			if err != nil {
				return nil, err
			}
			return func(w io.Writer) error { return writeTenantStatus(w, rows, asJSON) }, nil
		})
	}
	rows, err := read(ctx)
	if err != nil {
		return err
	}
	if err := writeTenantStatus(out, rows, asJSON); err != nil {
		return err
	}
	if n := failedTenants(rows); n > 0 {
		return fmt.Errorf("status: %d of %d tenants could not be read (see their rows)", n, len(rows))
	}
	return nil
}

func failedTenants(rows []admin.TenantStatus) int {
	n := 0
	for _, r := range rows {
		if r.Err != nil {
			n++
		}
	}
	return n
}

// writeTenantStatus prints the rows of status --tenants as a JSON array or a table.
func writeTenantStatus(w io.Writer, rows []admin.TenantStatus, asJSON bool) error {
	if asJSON {
		return dlqWriteJSON(w, rows)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tPENDING\tOLDEST PENDING AGE\tQUARANTINED\tBACKING OFF\tLEASES LIVE\tLEASES EXPIRED\tPUBLISHED LAST MINUTE\tERROR")
	for _, r := range rows {
		if r.Err != nil {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\t-\t%s\n", tenantName(r.Tenant), errLine(r.Err))
			continue
		}
		age := statusAge(time.Duration(r.OldestPendingAge))
		if r.Pending == 0 {
			age = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t-\n", tenantName(r.Tenant), r.Pending, age, r.Quarantined, r.BackingOff,
			r.LeasesLive, r.LeasesExpired, r.PublishedLastMinute)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	summary := dlqPlural(len(rows), "tenant")
	if n := failedTenants(rows); n > 0 {
		summary += fmt.Sprintf(", %d could not be read", n)
	}
	_, err := fmt.Fprintln(w, summary)
	return err
}

// writeStatus prints st as indented JSON or as aligned tables.
func writeStatus(w io.Writer, st *admin.Status, asJSON bool) error {
	if asJSON {
		b, err := json.MarshalIndent(st, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "outbox %s at %s\n\n", st.Schema, st.At.UTC().Format(time.RFC3339))
	age := statusAge(time.Duration(st.OldestPendingAge))
	if st.Pending == 0 {
		age = "-"
	}
	fmt.Fprintf(tw, "pending\t%d\n", st.Pending)
	fmt.Fprintf(tw, "oldest pending age\t%s\n", age)
	quarantined := fmt.Sprint(st.Quarantined)
	if st.Quarantined > 0 {
		quarantined += "\t(pgoutbox dlq list)"
	}
	fmt.Fprintf(tw, "quarantined\t%s\n", quarantined)
	writeSplit(tw, st)
	fmt.Fprintf(tw, "backing off\t%d\n", st.BackingOff)
	fmt.Fprintf(tw, "published last minute\t%d\n", st.PublishedLastMinute)
	fmt.Fprintf(tw, "skipped, ever\t%d\n", st.Skipped)
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w)
	if err := writeRelays(w, tw, st.Relays); err != nil {
		return err
	}
	if len(st.Destinations) > 0 {
		fmt.Fprintln(w)
		if err := writeDestinations(tw, st.Destinations); err != nil {
			return err
		}
	}

	fmt.Fprintln(w)
	if len(st.Leases) == 0 {
		fmt.Fprintln(w, "no leases")
	} else {
		fmt.Fprintln(tw, "RELAY\tLIVE LEASES\tEXPIRED LEASES")
		for _, l := range st.Leases {
			fmt.Fprintf(tw, "%s\t%d\t%d\n", l.RelayID, l.Live, l.Expired)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	fmt.Fprintln(w)
	fmt.Fprintln(tw, "TABLE\tTOTAL\tHEAP\tINDEXES")
	for _, t := range st.Tables {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.Name, statusSize(t.TotalBytes), statusSize(t.TableBytes), statusSize(t.IndexBytes))
	}
	if d := st.Dedup; d != nil {
		fmt.Fprintf(tw, "%s.%s (dedup)\t%s\t%s\t%s\n", d.Schema, d.Name, statusSize(d.TotalBytes), statusSize(d.TableBytes), statusSize(d.IndexBytes))
	} else {
		fmt.Fprintf(tw, "%s.processed_events (dedup)\tabsent\t\t\n", st.InboxSchema)
	}
	return tw.Flush()
}

// writeRelays prints the relays' heartbeats: "no relay running" when none is
// alive (none ever ran, all stopped or all gone), else one line a relay.
func writeRelays(w io.Writer, tw *tabwriter.Writer, relays []admin.RelayHeartbeat) error {
	running := 0
	for _, r := range relays {
		if r.Running() {
			running++
		}
	}
	if running == 0 {
		fmt.Fprintln(w, "no relay running")
	}
	if len(relays) == 0 {
		return nil
	}
	fmt.Fprintln(tw, "RELAY\tSTATE\tLAST SEEN\tSTARTED\tHOST\tPID\tVERSION")
	for _, r := range relays {
		state := r.State
		if r.Gone {
			state = "gone (" + r.State + " when last seen)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s ago\t%s\t%s\t%d\t%s\n", visible.Line(r.ID), state, statusAge(time.Duration(r.Age)),
			r.Started.UTC().Format(time.RFC3339), visible.Line(r.Host), r.PID, visible.Line(r.Version))
	}
	return tw.Flush()
}

// statusAge prints d for people: "850ms", "12.3s", "3m12s", "2h5m", "3d4h".
func statusAge(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 24*time.Hour:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
	default:
		d = d.Round(time.Hour)
		return fmt.Sprintf("%dd%dh", d/(24*time.Hour), (d%(24*time.Hour))/time.Hour)
	}
}

// statusSize prints n in binary units: "512 B", "1.5 KiB", "12 MiB".
func statusSize(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	v := float64(n)
	unit := ""
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB", "PiB"} {
		v /= 1024
		unit = u
		if v < 1024 {
			break
		}
	}
	if v < 10 {
		return fmt.Sprintf("%.1f %s", v, unit)
	}
	return fmt.Sprintf("%.0f %s", v, unit)
}
