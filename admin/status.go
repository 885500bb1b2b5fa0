package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
)

// Duration is a time.Duration that is written in JSON as a number of seconds.
type Duration time.Duration

// MarshalJSON writes d as seconds, e.g. 192.5.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).Seconds()) }

// UnmarshalJSON reads a number of seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s float64
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration in seconds: %w", err)
	}
	*d = Duration(s * float64(time.Second))
	return nil
}

// String formats d like time.Duration.
func (d Duration) String() string { return time.Duration(d).String() }

// Status is a snapshot of an outbox's health. Counts are exact at the moment each
// figure was read; the figures are not one transaction's snapshot.
type Status struct {
	Schema      string `json:"schema"`
	InboxSchema string `json:"inbox_schema"`
	// At is the database's clock when the snapshot was taken.
	At time.Time `json:"at"`

	// Pending counts unpublished events that are not quarantined, whatever they
	// wait for: a relay, their backoff, or the publish of a leased batch.
	Pending int64 `json:"pending"`
	// OldestPendingAge is how long ago the oldest pending event occurred
	// (occurred_at): the headline health figure. Zero when nothing is pending.
	// It grows while events stop flowing, whatever the reason.
	OldestPendingAge Duration `json:"oldest_pending_age_seconds"`
	// Quarantined counts dead letters: each blocks its aggregate's later events.
	Quarantined int64 `json:"quarantined"`
	// BackingOff counts pending events that failed and wait for available_at.
	BackingOff int64 `json:"backing_off"`
	// WaitingForRelay counts the pending events no dead letter holds back: they
	// wait for a relay (or their backoff). OldestWaitingForRelayAge is the age
	// of the oldest of them: the relays' lag.
	WaitingForRelay          int64    `json:"waiting_for_relay"`
	OldestWaitingForRelayAge Duration `json:"oldest_waiting_for_relay_age_seconds"`
	// BlockedBehindDeadLetter counts the pending events that wait behind a
	// dead letter of their own lane: no relay publishes them until an operator
	// retries or skips it. OldestBlockedAge is the age of the oldest of them.
	// Together they are Pending (each figure read at its own instant).
	BlockedBehindDeadLetter int64    `json:"blocked_behind_dead_letter"`
	OldestBlockedAge        Duration `json:"oldest_blocked_age_seconds"`
	// Leases lists, per relay id, the unpublished events it holds a live lease on
	// and those whose lease expired (its relay died or stalled; any relay takes
	// them over). Ordered by relay id.
	Leases []Lease `json:"leases"`
	// Relays lists the relays' heartbeats (Admin.Relays): running ones first.
	// "No relay running" is no Running entry; idle relays say State "idle".
	Relays []RelayHeartbeat `json:"relays"`
	// PublishedLastMinute counts events the broker acknowledged in the last
	// minute (skipped events excluded).
	PublishedLastMinute int64 `json:"published_last_minute"`
	// Skipped counts the audit rows of skipped events, ever.
	Skipped int64 `json:"skipped"`

	// Tables are the outbox's tables: outbox_events, outbox_aggregate_sequences
	// and outbox_skipped_events.
	Tables []TableSize `json:"tables"`
	// Dedup is the consumer inbox's processed_events table in InboxSchema, nil
	// when it does not exist there.
	Dedup *TableSize `json:"dedup_table"`

	// Destinations are the destinations of relays with destinations
	// (Admin.Destinations), each with its pending lanes and dead letters;
	// empty when the outbox has none.
	Destinations []Destination `json:"destinations,omitempty"`
}

// Lease counts the leases of one relay id (claimed_by) on unpublished events. A
// relay leases a run of one aggregate's events through the run's first event, so
// these count runs in flight, not events.
type Lease struct {
	RelayID string `json:"relay_id"`
	Live    int64  `json:"live"`
	Expired int64  `json:"expired"`
}

// TableSize is the disk use of one table, summed over its partitions if it has
// any.
type TableSize struct {
	Schema string `json:"schema"`
	Name   string `json:"name"`
	// TotalBytes is everything (pg_total_relation_size): heap, TOAST, indexes.
	TotalBytes int64 `json:"total_bytes"`
	// TableBytes is the main heap alone (pg_relation_size).
	TableBytes int64 `json:"table_bytes"`
	// IndexBytes is the indexes (pg_indexes_size).
	IndexBytes int64 `json:"index_bytes"`
}

// statusUnpublishedSQL reads every figure about unpublished events in one pass
// over the partial index outbox_events_unpublished_idx (published_at IS NULL):
// its cost follows the backlog, never the published history.
const statusUnpublishedSQL = `
SELECT e.claimed_by,
       count(*) FILTER (WHERE e.quarantined_at IS NULL),
       count(*) FILTER (WHERE e.quarantined_at IS NOT NULL),
       count(*) FILTER (WHERE e.quarantined_at IS NULL AND e.available_at > now()),
       count(*) FILTER (WHERE e.claimed_by IS NOT NULL AND e.claim_until > now()),
       count(*) FILTER (WHERE e.claimed_by IS NOT NULL AND (e.claim_until IS NULL OR e.claim_until <= now())),
       coalesce(extract(epoch FROM now() - min(e.occurred_at) FILTER (WHERE e.quarantined_at IS NULL)), 0)::float8
  FROM %s e
 WHERE e.published_at IS NULL
 GROUP BY e.claimed_by`

// statusPublishedSQL counts the last minute's publishes through the BRIN index on
// published_at (migration outbox/0003): only the page ranges written recently are
// read. Skips are published_at too, recorded in the (small) audit table. The
// destinations are counted in the same round trip: their figures are read only
// when there are some.
const statusPublishedSQL = `
SELECT now(),
       (SELECT count(*) FROM %[1]s e
         WHERE e.published_at >= now() - interval '1 minute'
           AND NOT EXISTS (SELECT 1 FROM %[2]s s WHERE s.event_id = e.event_id)),
       (SELECT count(*) FROM %[2]s),
       EXISTS (SELECT 1 FROM %[3]s)`

// statusSizeSQL sizes tables by schema and name. A partitioned table is the sum of
// its partitions (pg_partition_tree; it returns nothing for a plain table, and a
// partitioned parent's own size is zero). A table that does not exist comes back
// with exists = false.
const statusSizeSQL = `
SELECT t.schema, t.name, r.oid IS NOT NULL,
       coalesce(sz.total, 0), coalesce(sz.heap, 0), coalesce(sz.idx, 0)
  FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t (schema, name, ord)
  CROSS JOIN LATERAL (SELECT to_regclass(format('%I.%I', t.schema, t.name)) AS oid) r
  LEFT JOIN LATERAL (
        SELECT sum(pg_total_relation_size(p.relid))::bigint AS total,
               sum(pg_relation_size(p.relid))::bigint AS heap,
               sum(pg_indexes_size(p.relid))::bigint AS idx
          FROM (SELECT r.oid AS relid UNION SELECT relid FROM pg_partition_tree(r.oid)) p) sz ON r.oid IS NOT NULL
 ORDER BY t.ord`

// Status reads the outbox's health figures. Every query is cheap on a large table:
// unpublished rows are read through their partial index, the last minute's
// publishes through a BRIN index, and sizes from the catalog. The queries are
// sent together, in one round trip when a.db can send a batch (a pool, a
// connection, a transaction): the console reads the status of every tenant,
// on a database that may be loaded.
func (a *Admin) Status(ctx context.Context) (*Status, error) {
	st := &Status{Schema: a.schema, InboxSchema: a.inboxSchema, Leases: []Lease{}}

	var (
		relay                                        *string
		pending, quarantined, backoff, live, expired int64
		oldest                                       float64
		anyDestination                               bool
		ts                                           TableSize
		exists                                       bool
	)
	unpublished := read{what: "count unpublished events", sql: fmt.Sprintf(statusUnpublishedSQL, a.events),
		dest: []any{&relay, &pending, &quarantined, &backoff, &live, &expired, &oldest},
		row: func() error {
			st.Pending += pending
			st.Quarantined += quarantined
			st.BackingOff += backoff
			if age := Duration(oldest * float64(time.Second)); age > st.OldestPendingAge {
				st.OldestPendingAge = age
			}
			if relay != nil && live+expired > 0 {
				st.Leases = append(st.Leases, Lease{RelayID: *relay, Live: live, Expired: expired})
			}
			return nil
		}}
	relays := read{what: "relays", sql: a.relaysSQL(), collect: func(rows pgx.Rows) (err error) {
		st.Relays, err = pgx.CollectRows(rows, pgx.RowToStructByPos[RelayHeartbeat])
		return err
	}}
	published := read{what: "count recent publishes",
		sql:  fmt.Sprintf(statusPublishedSQL, a.events, a.skipped, a.table("outbox_destinations")),
		dest: []any{&st.At, &st.PublishedLastMinute, &st.Skipped, &anyDestination}, row: func() error { return nil }}
	sizes := read{what: "table sizes", sql: statusSizeSQL,
		args: []any{
			[]string{a.schema, a.schema, a.schema, a.inboxSchema},
			[]string{"outbox_events", "outbox_aggregate_sequences", "outbox_skipped_events", "processed_events"}},
		dest: []any{&ts.Schema, &ts.Name, &exists, &ts.TotalBytes, &ts.TableBytes, &ts.IndexBytes},
		row: func() error {
			switch {
			case ts.Name == "processed_events" && exists:
				d := ts
				st.Dedup = &d
			case ts.Name == "processed_events":
			case exists:
				st.Tables = append(st.Tables, ts)
			default:
				return fmt.Errorf("table %s.%s does not exist (is the schema migrated?)", ts.Schema, ts.Name)
			}
			return nil
		}}
	if err := readAll(ctx, a.db, unpublished, relays, a.waitingRead(st), published, sizes); err != nil {
		return nil, fmt.Errorf("admin: status: %w", err)
	}
	sort.Slice(st.Leases, func(i, j int) bool { return st.Leases[i].RelayID < st.Leases[j].RelayID })
	if anyDestination {
		var err error
		if st.Destinations, err = a.destinations(ctx, a.db, nil); err != nil {
			return nil, fmt.Errorf("admin: status: destinations: %w", err)
		}
	}
	return st, nil
}

// read is one query of a snapshot read with readAll: its rows are scanned
// into dest, then row is called, for each row; or collect reads them all.
type read struct {
	what    string // what it reads, for its error
	sql     string
	args    []any
	dest    []any
	row     func() error
	collect func(pgx.Rows) error
}

func (r read) scan(rows pgx.Rows) error {
	var err error
	if r.collect != nil {
		err = r.collect(rows)
	} else {
		_, err = pgx.ForEachRow(rows, r.dest, r.row)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", r.what, err)
	}
	return nil
}

// batcher is a DB that sends several statements in one round trip.
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// readAll runs reads, in one batch when db is a batcher, else one by one,
// and stops at the first error.
func readAll(ctx context.Context, db DB, reads ...read) error {
	bdb, ok := db.(batcher)
	if !ok {
		for _, r := range reads {
			rows, err := db.Query(ctx, r.sql, r.args...)
			if err != nil {
				return fmt.Errorf("%s: %w", r.what, err)
			}
			if err := r.scan(rows); err != nil {
				return err
			}
		}
		return nil
	}
	b := &pgx.Batch{}
	for _, r := range reads {
		b.Queue(r.sql, r.args...)
	}
	br := bdb.SendBatch(ctx, b)
	err := func() error {
		for _, r := range reads {
			rows, err := br.Query()
			if err != nil {
				return fmt.Errorf("%s: %w", r.what, err)
			}
			if err := r.scan(rows); err != nil {
				return err
			}
		}
		return nil
	}()
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	return err
}
