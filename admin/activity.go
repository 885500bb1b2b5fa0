package admin

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
)

// Activity is what an outbox did over a recent window, bucket by bucket (a
// minute, or what ActivityOver was given), and its
// backlog per aggregate type: the figures of the web console's overview
// (package admin/adminhttp). Like Status it reads unpublished rows through their
// partial index and published rows through the BRIN index on published_at, so
// its cost follows the backlog and the window, never the published history.
type Activity struct {
	// At is the database's clock when the figures were read; Since is At minus
	// the window, truncated to the bucket.
	At, Since time.Time
	// Bucket is the span of each entry of Minutes: a minute for Activity,
	// the bucket given to ActivityOver.
	Bucket Duration
	// Minutes has one entry per bucket from Since to At, oldest first, zeros
	// included (the name is from when every bucket was a minute).
	Minutes []MinuteActivity
	// ByAggregateType has the backlog and the window's publishes per aggregate
	// type, ordered by name; types with nothing pending, quarantined or
	// published in the window are absent.
	ByAggregateType []TypeActivity
	// Relays lists the relay ids that published in the window (claimed_by stays
	// on the rows a relay marks published), ordered by id.
	Relays []RelaySeen
}

// MinuteActivity counts one bucket's events (a minute's, for Activity).
type MinuteActivity struct {
	// At is the bucket's start.
	At time.Time
	// Published counts events the broker acknowledged in the bucket (skips
	// excluded).
	Published int64
	// Quarantined counts events quarantined in the bucket that are still
	// quarantined: the failures that stopped a lane. Failed attempts that led
	// to a backoff leave no timestamp in the table and are not counted here
	// (Status.BackingOff counts the events waiting for their retry).
	Quarantined int64
}

// TypeActivity is the backlog of one aggregate type.
type TypeActivity struct {
	AggregateType string
	Pending       int64
	Quarantined   int64
	// OldestPendingAge is the age of the type's oldest pending event (zero when
	// none is pending).
	OldestPendingAge Duration
	// Published counts the type's events published in the window.
	Published int64
}

// RelaySeen is one relay that published events in the window.
type RelaySeen struct {
	RelayID       string
	Published     int64
	LastPublished time.Time
}

// MaxActivityWindow is the longest window ActivityOver accepts (Activity's,
// a minute a bucket, is a day).
const MaxActivityWindow = 7 * 24 * time.Hour

// MaxActivityBuckets bounds the buckets of one read (a day of minutes), so
// the rows a read returns stay bounded whatever the window: a week is read
// in hours, not minutes.
const MaxActivityBuckets = 24 * 60

// activityUnpublishedSQL reads the backlog per type in one pass over the partial
// index of unpublished rows.
const activityUnpublishedSQL = `
SELECT e.aggregate_type,
       count(*) FILTER (WHERE e.quarantined_at IS NULL),
       count(*) FILTER (WHERE e.quarantined_at IS NOT NULL),
       coalesce(extract(epoch FROM $1::timestamptz - min(e.occurred_at) FILTER (WHERE e.quarantined_at IS NULL)), 0)::float8
  FROM %[1]s e
 WHERE e.published_at IS NULL
 GROUP BY e.aggregate_type`

// activityQuarantinedSQL counts the window's quarantines by bucket ($2
// seconds, from $1), through the same partial index.
const activityQuarantinedSQL = `
SELECT date_bin($2::bigint * interval '1 second', e.quarantined_at, $1), count(*)
  FROM %s e
 WHERE e.published_at IS NULL AND e.quarantined_at >= $1
 GROUP BY 1`

// activityPublishedSQL counts the window's publishes in one pass through the
// BRIN index on published_at, grouped by bucket ($2 seconds, from $1), type
// and relay; it returns those groups summed by bucket (type and relay NULL),
// then by type and relay (bucket NULL): buckets + types × relays rows, not
// their product. Skipped events are published_at too; the (small) skip table
// tells them apart.
const activityPublishedSQL = `
WITH g AS (
  SELECT date_bin($2::bigint * interval '1 second', e.published_at, $1) AS bucket, e.aggregate_type,
         coalesce(e.claimed_by, '') AS relay, count(*) AS n, max(e.published_at) AS last
    FROM %s e
   WHERE e.published_at >= $1
     AND NOT EXISTS (SELECT 1 FROM %s s WHERE s.event_id = e.event_id)
   GROUP BY 1, 2, 3)
SELECT bucket, NULL::text, NULL::text, sum(n)::bigint, max(last) FROM g GROUP BY bucket
UNION ALL
SELECT NULL, aggregate_type, relay, sum(n)::bigint, max(last) FROM g GROUP BY aggregate_type, relay`

// Activity reads the outbox's activity over the last window, minute by
// minute (a minute to a day).
func (a *Admin) Activity(ctx context.Context, window time.Duration) (*Activity, error) {
	return a.ActivityOver(ctx, window, time.Minute)
}

// ActivityOver reads the outbox's activity over the last window (a minute to
// MaxActivityWindow) in buckets of bucket (whole seconds, at least a minute,
// at most MaxActivityBuckets of them in the window): the database counts each
// bucket, so a week in hours returns 169 buckets' rows, not a week of events.
func (a *Admin) ActivityOver(ctx context.Context, window, bucket time.Duration) (*Activity, error) {
	if window < time.Minute || window > MaxActivityWindow {
		return nil, fmt.Errorf("admin: activity: window %s must be between 1m and %s", window, MaxActivityWindow)
	}
	if bucket < time.Minute || bucket%time.Second != 0 || window/bucket > MaxActivityBuckets {
		return nil, fmt.Errorf("admin: activity: bucket %s must be whole seconds, at least 1m, at most %d in the window %s",
			bucket, MaxActivityBuckets, window)
	}
	act := &Activity{Bucket: Duration(bucket)}
	var err error
	if act.At, err = a.Now(ctx); err != nil {
		return nil, fmt.Errorf("admin: activity: %w", err)
	}
	act.Since = act.At.Add(-window).Truncate(bucket)
	n := int(act.At.Truncate(bucket).Sub(act.Since)/bucket) + 1
	act.Minutes = make([]MinuteActivity, n)
	for i := range act.Minutes {
		act.Minutes[i].At = act.Since.Add(time.Duration(i) * bucket)
	}
	secs := int64(bucket / time.Second)
	minute := func(t time.Time) *MinuteActivity {
		i := int(t.Sub(act.Since) / bucket)
		if i < 0 || i >= n {
			return nil
		}
		return &act.Minutes[i]
	}
	types := map[string]*TypeActivity{}
	typ := func(name string) *TypeActivity {
		t := types[name]
		if t == nil {
			t = &TypeActivity{AggregateType: name}
			types[name] = t
		}
		return t
	}

	rows, err := a.db.Query(ctx, fmt.Sprintf(activityUnpublishedSQL, a.events), act.At)
	if err != nil {
		return nil, fmt.Errorf("admin: activity: backlog: %w", err)
	}
	var (
		name                 string
		pending, quarantined int64
		oldest               float64
	)
	_, err = pgx.ForEachRow(rows, []any{&name, &pending, &quarantined, &oldest}, func() error {
		t := typ(name)
		t.Pending, t.Quarantined = pending, quarantined
		t.OldestPendingAge = Duration(oldest * float64(time.Second))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("admin: activity: backlog: %w", err)
	}

	rows, err = a.db.Query(ctx, fmt.Sprintf(activityQuarantinedSQL, a.events), act.Since, secs)
	if err != nil {
		return nil, fmt.Errorf("admin: activity: quarantines: %w", err)
	}
	var (
		at    time.Time
		count int64
	)
	_, err = pgx.ForEachRow(rows, []any{&at, &count}, func() error {
		if m := minute(at); m != nil {
			m.Quarantined += count
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("admin: activity: quarantines: %w", err)
	}

	rows, err = a.db.Query(ctx, fmt.Sprintf(activityPublishedSQL, a.events, a.skipped), act.Since, secs)
	if err != nil {
		return nil, fmt.Errorf("admin: activity: publishes: %w", err)
	}
	relays := map[string]*RelaySeen{}
	var (
		last          time.Time
		startAt       *time.Time
		aggType, rely *string
	)
	_, err = pgx.ForEachRow(rows, []any{&startAt, &aggType, &rely, &count, &last}, func() error {
		if startAt != nil { // a bucket's row
			if m := minute(*startAt); m != nil {
				m.Published += count
			}
			return nil
		}
		if aggType == nil || rely == nil {
			return fmt.Errorf("a row of neither grouping set")
		}
		typ(*aggType).Published += count
		if relay := *rely; relay != "" {
			r := relays[relay]
			if r == nil {
				r = &RelaySeen{RelayID: relay}
				relays[relay] = r
			}
			r.Published += count
			if last.After(r.LastPublished) {
				r.LastPublished = last
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("admin: activity: publishes: %w", err)
	}
	for _, t := range types {
		if t.Pending+t.Quarantined+t.Published > 0 {
			act.ByAggregateType = append(act.ByAggregateType, *t)
		}
	}
	sort.Slice(act.ByAggregateType, func(i, j int) bool {
		return act.ByAggregateType[i].AggregateType < act.ByAggregateType[j].AggregateType
	})
	for _, r := range relays {
		act.Relays = append(act.Relays, *r)
	}
	sort.Slice(act.Relays, func(i, j int) bool { return act.Relays[i].RelayID < act.Relays[j].RelayID })
	return act, nil
}
