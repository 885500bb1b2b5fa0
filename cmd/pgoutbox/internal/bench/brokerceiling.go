package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// brokerCeilingAckTimeout bounds the wait for one batch's acks in the broker
// ceiling.
const brokerCeilingAckTimeout = time.Minute

// brokerCeiling times the broker alone: the drain's events, with payloads of the
// drain's size and a Nats-Msg-Id each, published by publishers connections in
// batches of the drain's batch size (each batch published asynchronously, then
// its acks awaited), with no database at all. It is the broker's side of the
// combined ceiling; only NATS brokers are timed (ok false otherwise: the null
// broker costs nothing).
func (r *Runner) brokerCeiling(ctx context.Context, b *brokerEnv, publishers int) (eps float64, ok bool, err error) {
	if !b.isNATS() {
		return 0, false, nil
	}
	c := r.cfg
	if err := b.reset(ctx); err != nil {
		return 0, false, err
	}
	defer func() {
		if rerr := b.reset(ctx); err == nil && rerr != nil {
			err = rerr
		}
	}()
	publishers = max(publishers, 1)
	r.prog.step("drain: broker ceiling: %d events → %s alone, %d publisher(s)", c.Events, b.name, publishers)
	pad := make([]byte, max(c.PayloadBytes-24, 0))
	for i := range pad {
		pad[i] = 'x'
	}
	conns := make([]jetstream.JetStream, publishers)
	for i := range conns {
		nc, err := natsgo.Connect(b.url, natsgo.Name("pgoutbox bench broker ceiling"))
		if err != nil {
			return 0, false, fmt.Errorf("broker ceiling: connect: %w", err)
		}
		defer nc.Close()
		if conns[i], err = jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(max(c.BatchSize, 1))); err != nil {
			return 0, false, fmt.Errorf("broker ceiling: %w", err)
		}
	}
	run := randHex(4)
	subject := b.prefix + ".ceiling"
	errs := make([]error, publishers)
	var wg sync.WaitGroup
	start := time.Now()
	for p, js := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[p] = publishShare(ctx, js, subject, run, p, publishers, c.Events, c.BatchSize, pad)
		}()
	}
	wg.Wait()
	el := time.Since(start)
	for _, err := range errs {
		if err != nil {
			return 0, false, fmt.Errorf("broker ceiling: %w", err)
		}
	}
	m, err := b.messages(ctx)
	if err != nil {
		return 0, false, err
	}
	if m != uint64(c.Events) {
		return 0, false, fmt.Errorf("broker ceiling: stream %s holds %d messages, want %d", b.stream, m, c.Events)
	}
	return round2(float64(c.Events) / el.Seconds()), true, nil
}

// publishShare publishes the events i ≡ p (mod publishers) of events, batch by
// batch, waiting for each batch's acks before the next.
func publishShare(ctx context.Context, js jetstream.JetStream, subject, run string, p, publishers, events, batch int, pad []byte) error {
	batch = max(batch, 1)
	futures := make([]jetstream.PubAckFuture, 0, batch)
	flush := func() error {
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return err
			case <-time.After(brokerCeilingAckTimeout):
				return fmt.Errorf("no ack within %s", brokerCeilingAckTimeout)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		futures = futures[:0]
		return nil
	}
	for i := p; i < events; i += publishers {
		body := fmt.Appendf(nil, `{"i": %d, "pad": "%s"}`, i, pad)
		msg := &natsgo.Msg{Subject: subject, Data: body, Header: natsgo.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, run+"-"+strconv.Itoa(i))
		msg.Header.Set("pgoutbox-event-type", "bench.event")
		f, err := js.PublishMsgAsync(msg)
		if err != nil {
			return err
		}
		if futures = append(futures, f); len(futures) == batch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

// combinedCeiling is the rate of doing both sides' work on shared CPUs, one
// after the other: 1 / (1/sql + 1/broker).
func combinedCeiling(sql, broker float64) float64 {
	if sql <= 0 || broker <= 0 {
		return 0
	}
	return round2(1 / (1/sql + 1/broker))
}
