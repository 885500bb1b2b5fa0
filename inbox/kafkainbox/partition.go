package kafkainbox

import (
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/internal/subscriber"
)

// partition is the goroutine of one assigned partition: it processes the
// partition's records one at a time, in offset order, and keeps the offset up to
// which every record is done. It lives from the assignment to the revocation; a
// partition assigned again gets a new one.
type partition struct {
	s  *Subscriber
	cl *kgo.Client
	tp topicPartition

	quit chan struct{} // closed by stop
	done chan struct{} // closed when run returns
	wake chan struct{} // records were queued (capacity 1)

	mu        sync.Mutex
	queue     []*kgo.Record // fetched, not started, in offset order
	paused    bool          // fetching is paused: queue reached MaxBufferedRecords
	finished  kgo.EpochOffset
	committed int64 // offset last committed by this goroutine's commits, -1 for none
}

func newPartition(s *Subscriber, cl *kgo.Client, tp topicPartition) *partition {
	return &partition{
		s: s, cl: cl, tp: tp,
		quit:      make(chan struct{}),
		done:      make(chan struct{}),
		wake:      make(chan struct{}, 1),
		finished:  kgo.EpochOffset{Epoch: -1, Offset: -1},
		committed: -1,
	}
}

// push queues fetched records. It never blocks: when the queue is full, the
// client stops fetching the partition until run has worked half of it off.
func (p *partition) push(recs []*kgo.Record) {
	p.mu.Lock()
	p.queue = append(p.queue, recs...)
	if !p.paused && len(p.queue) >= p.s.cfg.MaxBufferedRecords {
		// Under p.mu, so that pause and resume reach the client in the order
		// p.paused changes. Records of the partition the client has buffered are
		// not lost: a paused partition's are dropped and fetched again after
		// the resume, from the offset after the last record polled.
		p.paused = true
		p.cl.PauseFetchPartitions(map[string][]int32{p.tp.topic: {p.tp.partition}})
	}
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// next returns the next record to process, waiting for one; false once stopped.
func (p *partition) next() (*kgo.Record, bool) {
	for {
		select {
		case <-p.quit:
			return nil, false
		default:
		}
		p.mu.Lock()
		if len(p.queue) > 0 {
			rec := p.queue[0]
			p.queue[0] = nil
			p.queue = p.queue[1:]
			if p.paused && len(p.queue) <= p.s.cfg.MaxBufferedRecords/2 {
				p.paused = false
				p.cl.ResumeFetchPartitions(map[string][]int32{p.tp.topic: {p.tp.partition}})
			}
			p.mu.Unlock()
			return rec, true
		}
		p.mu.Unlock()
		select {
		case <-p.quit:
			return nil, false
		case <-p.wake:
		}
	}
}

func (p *partition) run() {
	defer p.s.workers.Done()
	defer close(p.done)
	for {
		rec, ok := p.next()
		if !ok || !p.s.handle(p, rec) {
			return
		}
	}
}

// stop makes run return: after the record inside Process, at once if it waits.
func (p *partition) stop() {
	select {
	case <-p.quit:
	default:
		close(p.quit)
	}
}

// sleep waits d; false when the partition stops first.
func (p *partition) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.quit:
		return false
	case <-p.s.lc.Hard().Done():
		return false
	}
}

// finish records that rec is done; as records are done in offset order, every
// record before it is done too.
func (p *partition) finish(rec *kgo.Record) {
	p.mu.Lock()
	p.finished = kgo.EpochOffset{Epoch: rec.LeaderEpoch, Offset: rec.Offset + 1}
	p.mu.Unlock()
}

// uncommitted returns the offset to commit, if it moved since the last commit.
func (p *partition) uncommitted() (kgo.EpochOffset, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.finished, p.finished.Offset > p.committed
}

func (p *partition) committedUpTo(offset int64) {
	p.mu.Lock()
	p.committed = max(p.committed, offset)
	p.mu.Unlock()
}

// handle processes rec until it is done, in place: a record that is not done is
// processed again after Outcome.RetryAfter, holding up its partition. It reports
// false when the partition stopped (or the Subscriber was stopped hard) before
// rec was done: rec is then not finished, and its offset is never committed here.
func (s *Subscriber) handle(p *partition, rec *kgo.Record) bool {
	d := inbox.Delivery{Body: rec.Value, Headers: make(map[string]string, len(rec.Headers))}
	for _, h := range rec.Headers {
		if _, dup := d.Headers[h.Key]; !dup { // Kafka allows repeated keys; the first one counts
			d.Headers[h.Key] = string(h.Value)
		}
	}
	for attempt := 1; ; attempt++ {
		// Kafka counts no deliveries; the attempts in place scale the inbox's
		// backoff. A record re-read by a new owner starts again at 1.
		d.Attempt = attempt
		select {
		case s.sem <- struct{}{}:
		case <-p.quit:
			return false
		}
		o := subscriber.Process(s.lc.Hard(), s.proc, s.cfg.ProcessTimeout, d)
		<-s.sem

		switch subscriber.Judge(o) {
		case subscriber.Ack:
			// Only now may the offset move past the record. A crash before the
			// commit of that offset means a re-read, which the inbox recognises.
			p.finish(rec)
			s.acked.Add(1)
			return true
		case subscriber.Term:
			p.finish(rec)
			s.terminated.Add(1)
			s.log.Error("skipped a record that is not an outbox event; its offset is committed", recordAttrs(rec, slog.Any("error", o.Err))...)
			return true
		}
		select {
		case <-p.quit:
			return false // revoked or stopping: the next owner processes it
		default:
		}
		if s.lc.Hard().Err() != nil {
			return false // abandoned by a hard stop: the next owner processes it
		}
		if s.cfg.MaxAttempts > 0 && attempt >= s.cfg.MaxAttempts {
			p.finish(rec)
			s.skipped.Add(1)
			s.log.Error("skipped a record after Config.MaxAttempts; its offset is committed and its event is not applied",
				recordAttrs(rec, slog.Int("attempts", attempt), slog.String("status", o.Status.String()), slog.Any("error", o.Err))...)
			return true
		}
		s.retried.Add(1)
		if !p.sleep(o.RetryAfter) {
			return false
		}
	}
}

func recordAttrs(rec *kgo.Record, extra ...slog.Attr) []any {
	a := []any{slog.String("topic", rec.Topic), slog.Int("partition", int(rec.Partition)),
		slog.Int64("offset", rec.Offset), slog.String("key", string(rec.Key))}
	for _, x := range extra {
		a = append(a, x)
	}
	return a
}
