package cdc

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector returns a Prometheus collector of the source's metrics, labelled
// with the schema and the slot. Slot figures are read from pg_replication_slots
// at each scrape (bounded by CollectTimeout); a failed read leaves them out.
//
//	pgoutbox_cdc_slot_lag_bytes           WAL between the server's position and the slot's confirmed position
//	pgoutbox_cdc_slot_lag_seconds         age of the oldest received transaction not yet confirmed (0 when caught up)
//	pgoutbox_cdc_slot_retained_wal_bytes  WAL the server keeps for the slot (from its restart position)
//	pgoutbox_cdc_slot_active              1 while a process streams from the slot
//	pgoutbox_cdc_events_behind            events not yet published (including quarantined ones)
//	pgoutbox_cdc_buffered_events          events received from the slot and not yet settled
//	pgoutbox_cdc_blocked_lanes            aggregates the table path owns (a failed or quarantined event)
//	pgoutbox_cdc_events_published_total   events acknowledged and marked published
//	pgoutbox_cdc_publish_failures_total   failed publish attempts recorded
//	pgoutbox_cdc_events_quarantined_total events quarantined
func (s *Source) Collector() prometheus.Collector {
	return &collector{s: s, labels: prometheus.Labels{"schema": s.cfg.Schema, "slot": s.cfg.Slot}}
}

type collector struct {
	s      *Source
	labels prometheus.Labels
}

func (c *collector) desc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc("pgoutbox_cdc_"+name, help, nil, c.labels)
}

func (c *collector) descs() map[string]*prometheus.Desc {
	return map[string]*prometheus.Desc{
		"lag_bytes":   c.desc("slot_lag_bytes", "WAL bytes between the server's current position and the slot's confirmed flush position."),
		"lag_seconds": c.desc("slot_lag_seconds", "Age of the oldest transaction received from the slot and not yet confirmed; 0 when caught up."),
		"retained":    c.desc("slot_retained_wal_bytes", "WAL bytes the server retains for the slot (from its restart position)."),
		"active":      c.desc("slot_active", "1 while a process streams from the slot."),
		"behind":      c.desc("events_behind", "Events not yet published, quarantined ones included."),
		"buffered":    c.desc("buffered_events", "Events received from the slot and not yet settled."),
		"blocked":     c.desc("blocked_lanes", "Aggregates whose events the table path publishes (after a failure, or a backfill)."),
		"published":   c.desc("events_published_total", "Events acknowledged by the broker and marked published."),
		"failures":    c.desc("publish_failures_total", "Failed publish attempts recorded."),
		"quarantined": c.desc("events_quarantined_total", "Events quarantined."),
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs() {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	d := c.descs()
	s := c.s
	ctx, cancel := context.WithTimeout(context.Background(), CollectTimeout)
	defer cancel()
	var lag, retained *int64
	var active bool
	err := s.pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint,
       pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, active
  FROM pg_replication_slots WHERE slot_name = $1`, s.cfg.Slot).Scan(&lag, &retained, &active)
	if err == nil {
		if lag != nil {
			ch <- prometheus.MustNewConstMetric(d["lag_bytes"], prometheus.GaugeValue, float64(max(*lag, 0)))
		}
		if retained != nil {
			ch <- prometheus.MustNewConstMetric(d["retained"], prometheus.GaugeValue, float64(max(*retained, 0)))
		}
		ch <- prometheus.MustNewConstMetric(d["active"], prometheus.GaugeValue, boolFloat(active))
	}
	var behind int64
	if err := s.pool.QueryRow(ctx, s.q.eventsBehind).Scan(&behind); err == nil {
		ch <- prometheus.MustNewConstMetric(d["behind"], prometheus.GaugeValue, float64(behind))
	}
	ch <- prometheus.MustNewConstMetric(d["lag_seconds"], prometheus.GaugeValue, s.LagSeconds())
	s.mu.Lock()
	buffered, blocked := s.buffered, len(s.blocked)
	s.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(d["buffered"], prometheus.GaugeValue, float64(buffered))
	ch <- prometheus.MustNewConstMetric(d["blocked"], prometheus.GaugeValue, float64(blocked))
	st := s.Stats()
	ch <- prometheus.MustNewConstMetric(d["published"], prometheus.CounterValue, float64(st.Published))
	ch <- prometheus.MustNewConstMetric(d["failures"], prometheus.CounterValue, float64(st.Failed))
	ch <- prometheus.MustNewConstMetric(d["quarantined"], prometheus.CounterValue, float64(st.Quarantined))
}

// LagSeconds is the age of the oldest transaction received from the slot and not
// yet confirmed, 0 when everything received is confirmed.
func (s *Source) LagSeconds() float64 { return s.lag().Seconds() }

// lag is the age of the oldest transaction received and not yet confirmed.
func (s *Source) lag() time.Duration {
	t := s.oldestUnconfirmed()
	if t.IsZero() {
		return 0
	}
	return max(time.Since(t), 0)
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
