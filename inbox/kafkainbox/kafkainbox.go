package kafkainbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/kafkalog"
	"github.com/pgoutbox/pgoutbox/internal/lifecycle"
	"github.com/pgoutbox/pgoutbox/internal/retry"
)

// The defaults of Config's fields.
const (
	DefaultConcurrency        = 4
	DefaultMaxBufferedRecords = 500
	DefaultProcessTimeout     = 30 * time.Second
	DefaultMaxAttempts        = -1 // unlimited
	DefaultCommitInterval     = time.Second
	DefaultCommitTimeout      = 10 * time.Second
)

// Config configures a Subscriber. A nil *Config means all defaults; each field
// names its default.
type Config struct {
	// Concurrency is how many records this Subscriber processes at once, each in
	// its own transaction (size the database pool for it), across its
	// partitions; the records of one partition are always processed one at a
	// time. Zero means DefaultConcurrency (4).
	Concurrency int

	// MaxBufferedRecords is how many fetched records one partition may hold
	// before fetching that partition pauses, until half of them are processed
	// (a record being retried holds up its partition, so this is what bounds the
	// memory it ties up). A resumed partition is fetched again once the fetch in
	// flight to its broker returns, after up to kgo.FetchMaxWait when the other
	// partitions have nothing new: keep it well above what a partition
	// processes in that time. It also bounds the records taken from the client
	// in one poll. Zero means DefaultMaxBufferedRecords (500).
	MaxBufferedRecords int

	// ProcessTimeout bounds one Process call (the consumer transaction with its
	// handler). A revocation waits for the record in progress, so it must stay
	// below the group's rebalance timeout (kgo.RebalanceTimeout, 60s by
	// default); Start checks. Zero means DefaultProcessTimeout (30s).
	ProcessTimeout time.Duration

	// MaxAttempts is how many times a record is processed at most before it is
	// skipped: logged as an error and its offset committed, as if it were done.
	// -1 is unlimited: a record that is never done stops its partition. Under
	// inbox.GapReject a skipped event makes its aggregate wait for a
	// reconciliation (inbox.Consumer.SetPosition). Zero means DefaultMaxAttempts
	// (-1).
	MaxAttempts int

	// CommitInterval is how often finished offsets are committed to Kafka. It
	// bounds what a crash makes the next owner re-read (each re-read record is a
	// duplicate for the inbox). Revocations and Stop always commit. Zero means
	// DefaultCommitInterval (1s).
	CommitInterval time.Duration

	// CommitTimeout bounds one offset commit, including the final one of a
	// revocation or of Stop. Zero means DefaultCommitTimeout (10s).
	CommitTimeout time.Duration

	// Logger receives skipped records, rebalances, commit errors and, for the
	// client New builds, the client's warnings and errors (its informational
	// lines too when the handler is enabled for debug). Nil means
	// slog.Default().
	Logger *slog.Logger
}

// Validate reports what New would reject in c: the config as given, its zero
// fields meaning their defaults. It is safe on a nil receiver (all defaults are
// valid). Several problems are joined with errors.Join.
func (c *Config) Validate() error {
	_, err := c.withDefaults()
	return err
}

func (c *Config) withDefaults() (Config, error) {
	return config.Resolve("kafkainbox", c, func(out *Config) {
		config.Default(&out.Concurrency, DefaultConcurrency)
		config.Default(&out.MaxBufferedRecords, DefaultMaxBufferedRecords)
		config.Default(&out.ProcessTimeout, DefaultProcessTimeout)
		config.Default(&out.MaxAttempts, DefaultMaxAttempts)
		config.Default(&out.CommitInterval, DefaultCommitInterval)
		config.Default(&out.CommitTimeout, DefaultCommitTimeout)
		if out.Logger == nil {
			out.Logger = slog.Default()
		}
	}, func(out *Config, p *config.Problems) {
		p.Check(out.Concurrency > 0 && out.Concurrency <= 1024, "Config.Concurrency %d: want 1..1024", out.Concurrency)
		p.Check(out.MaxBufferedRecords >= 2, "Config.MaxBufferedRecords %d: want at least 2", out.MaxBufferedRecords)
		p.Check(out.ProcessTimeout > 0, "Config.ProcessTimeout %s: must be positive", out.ProcessTimeout)
		p.Check(out.MaxAttempts == -1 || out.MaxAttempts > 0, "Config.MaxAttempts %d: want -1 or a positive count", out.MaxAttempts)
		p.Check(out.CommitInterval >= 10*time.Millisecond, "Config.CommitInterval %s: want at least 10ms", out.CommitInterval)
		p.Check(out.CommitTimeout > 0, "Config.CommitTimeout %s: must be positive", out.CommitTimeout)
	})
}

// Stats are a Subscriber's counters since Start.
type Stats struct {
	Acked        int64 // records done: applied or duplicate
	Retried      int64 // attempts in place after a gap-rejected or failed outcome
	Terminated   int64 // undecodable records skipped
	Skipped      int64 // records skipped after Config.MaxAttempts
	Commits      int64 // offset commits that succeeded
	CommitErrors int64 // offset commits that failed, entirely or for some partition
	Partitions   int   // partitions assigned now
}

// Subscriber consumes topics as a member of a Kafka consumer group into an
// inbox.Processor. Create it with New or Dial, Start it, and Stop it to shut down
// gracefully; it is not restartable.
type Subscriber struct {
	cfg  Config
	opts []kgo.Opt
	proc inbox.Processor
	log  *slog.Logger
	sem  chan struct{} // one token per record inside Process

	// lc runs the poll and commit loops and the shutdown; its Hard ends Process
	// calls (Stop's deadline passed, or Start's ctx ended).
	lc         lifecycle.Lifecycle
	cl         *kgo.Client
	pollCtx    context.Context // ends the poll and commit loops
	pollCancel context.CancelFunc
	loops      sync.WaitGroup // poll and commit loops
	workers    sync.WaitGroup // partition goroutines
	ready      chan struct{}  // closed once start has set the fields above; callbacks wait for it
	readyOnce  sync.Once

	mu       sync.Mutex
	parts    map[topicPartition]*partition // assigned partitions
	stopping bool                          // no partition starts another record

	// commitMu orders commits: a periodic commit that read a partition's offset
	// finishes before a revocation commits that partition for the last time.
	commitMu sync.Mutex

	acked, retried, terminated, skipped, commits, commitErrors atomic.Int64
}

type topicPartition struct {
	topic     string
	partition int32
}

// New returns a Subscriber that processes with proc the records read by a client
// built, at Start, from opts: the franz-go options of a group consumer —
// kgo.SeedBrokers, kgo.ConsumeTopics (or kgo.ConsumeRegex) and whatever the cluster
// needs (kgo.DialTLSConfig, kgo.SASL, timeouts). cfg may be nil for all defaults;
// invalid settings are reported here, unusable client options by Start.
//
// The Subscriber owns the client, because its guarantees rest on options franz-go
// only takes at construction. Before opts, it sets defaults that opts may
// override: kgo.ConsumerGroup(proc.Name()), kgo.ConsumeResetOffset at the start of
// each partition (a new group reads everything, as a JetStream consumer with
// DeliverAll does; under inbox.GapReject a group that starts later needs its
// positions seeded), kgo.FetchMaxWait(time.Second) (a partition whose fetching
// resumes waits for the fetch in flight) and a logger writing to Config.Logger.
// After opts, it sets what it cannot do without, replacing anything opts said:
// kgo.DisableAutoCommit, kgo.BlockRebalanceOnPoll, and its own
// kgo.OnPartitionsAssigned, kgo.OnPartitionsRevoked and kgo.OnPartitionsLost.
func New(opts []kgo.Opt, proc inbox.Processor, cfg *Config) (*Subscriber, error) {
	if proc == nil {
		return nil, errors.New("kafkainbox: New needs a processor")
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Subscriber{
		cfg:   c,
		proc:  proc,
		log:   c.Logger.With(slog.String("consumer", proc.Name())),
		sem:   make(chan struct{}, c.Concurrency),
		ready: make(chan struct{}),
		parts: map[topicPartition]*partition{},
	}
	s.lc.Name = "kafkainbox"
	s.lc.Stopped = s.stopped
	s.opts = append(s.opts,
		kgo.ConsumerGroup(proc.Name()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(time.Second),
		kgo.WithLogger(kafkalog.New(c.Logger)),
	)
	s.opts = append(s.opts, opts...)
	s.opts = append(s.opts,
		// Offsets are committed by the Subscriber, each only once its record is
		// done; franz-go's autocommit would commit what was polled.
		kgo.DisableAutoCommit(),
		// Revocations run only between polls, so records handed to a partition
		// goroutine are never those of a partition already given away.
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(s.assigned),
		kgo.OnPartitionsRevoked(s.revoked),
		kgo.OnPartitionsLost(s.lost),
	)
	return s, nil
}

// Dial is New for the common case: a Subscriber in group (proc.Name() when empty)
// that reads topics from the cluster at seedBrokers ("host:port"), without TLS or
// authentication. Use New for anything more.
func Dial(seedBrokers []string, group string, topics []string, proc inbox.Processor, cfg *Config) (*Subscriber, error) {
	if len(seedBrokers) == 0 || len(topics) == 0 {
		return nil, errors.New("kafkainbox: Dial needs seed brokers and topics")
	}
	opts := []kgo.Opt{kgo.SeedBrokers(seedBrokers...), kgo.ConsumeTopics(topics...)}
	if group != "" {
		opts = append(opts, kgo.ConsumerGroup(group))
	}
	return New(opts, proc, cfg)
}

// Stats returns the Subscriber's counters.
func (s *Subscriber) Stats() Stats {
	s.mu.Lock()
	n := len(s.parts)
	s.mu.Unlock()
	return Stats{
		Acked: s.acked.Load(), Retried: s.retried.Load(), Terminated: s.terminated.Load(),
		Skipped: s.skipped.Load(), Commits: s.commits.Load(), CommitErrors: s.commitErrors.Load(),
		Partitions: n,
	}
}

// Start builds the client, which joins the group, checks that a broker answers,
// and starts consuming; it returns once that is under way. ctx bounds the check,
// and its end later stops the Subscriber hard (in-flight transactions are
// abandoned and rolled back, finished offsets still committed); prefer Stop.
//
// Start follows the one rule of pgoutbox's services: a second Start returns an
// error matching lifecycle.ErrAlreadyStarted, a Start after Stop (or after a
// failed Start) one matching lifecycle.ErrStopped; a Subscriber is not
// restartable.
func (s *Subscriber) Start(ctx context.Context) error {
	err := s.lc.Start(ctx, s.start)
	s.setReady() // without a client too: callbacks never come then
	return err
}

func (s *Subscriber) start(ctx context.Context) error {
	cl, err := kgo.NewClient(s.opts...)
	if err != nil {
		return fmt.Errorf("kafkainbox: client: %w", err)
	}
	// The client joins the group on its own from here on, and may call back at
	// any time: the callbacks wait for ready.
	group, _ := cl.OptValue(kgo.ConsumerGroup).(string)
	s.cl = cl
	s.log = s.log.With(slog.String("group", group))
	s.pollCtx, s.pollCancel = context.WithCancel(context.Background())
	s.setReady()
	// From here on, stopping (or a failed Start) shuts the client down.
	s.lc.Go(s.shutdown)
	if err := s.checkClient(cl); err != nil {
		return err
	}
	if err := cl.Ping(ctx); err != nil {
		return fmt.Errorf("kafkainbox: group %s: no broker answered: %w", group, err)
	}
	topics, _ := cl.OptValue(kgo.ConsumeTopics).([]string)
	s.log.Info("subscriber starting", slog.Any("topics", topics), slog.Int("concurrency", s.cfg.Concurrency))

	s.loops.Add(2)
	s.lc.Go(s.poll)
	s.lc.Go(s.commitLoop)
	return nil
}

// setReady lets the client's callbacks run.
func (s *Subscriber) setReady() { s.readyOnce.Do(func() { close(s.ready) }) }

// checkClient refuses client options the Subscriber cannot work with.
func (s *Subscriber) checkClient(cl *kgo.Client) error {
	if g, _ := cl.OptValue(kgo.ConsumerGroup).(string); g == "" {
		return errors.New("kafkainbox: the client options leave the consumer group empty (kgo.ConsumerGroup)")
	}
	if topics, _ := cl.OptValue(kgo.ConsumeTopics).([]string); len(topics) == 0 {
		return errors.New("kafkainbox: the client options name no topics to consume (kgo.ConsumeTopics)")
	}
	if parts, _ := cl.OptValue(kgo.ConsumePartitions).(map[string]map[int32]kgo.Offset); len(parts) > 0 {
		return errors.New("kafkainbox: the client options assign partitions directly (kgo.ConsumePartitions); the Subscriber consumes as a group member")
	}
	if share, _ := cl.OptValue(kgo.ShareGroup).(string); share != "" {
		return errors.New("kafkainbox: the client options join a share group (kgo.ShareGroup); the Subscriber needs a consumer group, which keeps partition order")
	}
	if rt, _ := cl.OptValue(kgo.RebalanceTimeout).(time.Duration); rt > 0 && s.cfg.ProcessTimeout >= rt {
		return fmt.Errorf("kafkainbox: Config.ProcessTimeout %s: must be below the group's rebalance timeout %s, which a revocation must not outlast",
			s.cfg.ProcessTimeout, rt)
	}
	return nil
}

// poll hands fetched records to their partition goroutines until the Subscriber
// stops. Handing over never blocks (a partition holding too many records is
// paused instead), so rebalances, blocked between a poll and AllowRebalance, are
// never held up.
func (s *Subscriber) poll() {
	defer s.loops.Done()
	var backoff retry.Backoff // the reconnect schedule: 100ms doubling to 5s
	for {
		fetches := s.cl.PollRecords(s.pollCtx, s.cfg.MaxBufferedRecords)
		if fetches.IsClientClosed() || s.pollCtx.Err() != nil {
			s.cl.AllowRebalance()
			return
		}
		var failed error
		fetches.EachError(func(topic string, p int32, err error) {
			failed = err
			s.log.Warn("fetch failed", slog.String("topic", topic), slog.Int("partition", int(p)), slog.Any("error", err))
		})
		fetches.EachPartition(func(ftp kgo.FetchTopicPartition) {
			if len(ftp.Records) > 0 {
				s.partition(s.cl, topicPartition{ftp.Topic, ftp.Partition}).push(ftp.Records)
			}
		})
		s.cl.AllowRebalance()
		if failed == nil || fetches.NumRecords() > 0 {
			backoff.Reset()
			continue
		}
		// franz-go retries what can be retried itself; what it reports keeps
		// coming (a topic that does not exist, an authorization error): do
		// not spin on it.
		retry.Sleep(s.pollCtx, backoff.Next())
	}
}

// partition returns the goroutine of an assigned partition, starting it if need be.
func (s *Subscriber) partition(cl *kgo.Client, tp topicPartition) *partition {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.parts[tp]
	if p == nil {
		p = newPartition(s, cl, tp)
		if s.stopping {
			p.stop()
		}
		s.parts[tp] = p
		s.workers.Add(1)
		go p.run()
	}
	return p
}

// assigned starts the goroutines of newly assigned partitions.
func (s *Subscriber) assigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	<-s.ready
	for topic, ps := range assigned {
		for _, p := range ps {
			s.partition(cl, topicPartition{topic, p})
		}
	}
	s.log.Info("partitions assigned", slog.Any("partitions", assigned))
}

// revoked stops the goroutines of partitions that move to another member and
// commits their finished offsets before the rebalance goes on, so that the new
// owner starts right after the last record done here.
func (s *Subscriber) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	<-s.ready
	parts := s.detach(revoked)
	stopAll(parts)
	cctx, cancel := context.WithTimeout(ctx, s.cfg.CommitTimeout)
	s.commit(cctx, cl, parts)
	cancel()
	resumeAll(cl, parts)
	if len(parts) > 0 {
		s.log.Info("partitions revoked; finished offsets committed", slog.Any("partitions", revoked))
	}
}

// lost stops the goroutines of partitions the member no longer owns, fenced from
// the group. A commit would be refused: their next owner re-reads from the last
// one, and the inbox recognises what was applied since.
func (s *Subscriber) lost(_ context.Context, cl *kgo.Client, lost map[string][]int32) {
	<-s.ready
	parts := s.detach(lost)
	stopAll(parts)
	resumeAll(cl, parts)
	if len(parts) > 0 {
		s.log.Warn("partitions lost; records finished since the last commit will be re-read by their next owner",
			slog.Any("partitions", lost))
	}
}

// detach removes partitions from the assigned set and returns their goroutines.
func (s *Subscriber) detach(which map[string][]int32) []*partition {
	return s.detachFunc(func(tp topicPartition) bool { return slices.Contains(which[tp.topic], tp.partition) })
}

func (s *Subscriber) detachFunc(match func(topicPartition) bool) []*partition {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*partition
	for tp, p := range s.parts {
		if match(tp) {
			out = append(out, p)
			delete(s.parts, tp)
		}
	}
	return out
}

// stopAll stops partition goroutines and waits for them: each finishes the record
// inside Process, abandons a retry, and starts no other.
func stopAll(parts []*partition) {
	for _, p := range parts {
		p.stop()
	}
	for _, p := range parts {
		<-p.done
	}
}

// resumeAll clears a pause of stopped partitions, so that the client fetches them
// should they be assigned here again.
func resumeAll(cl *kgo.Client, parts []*partition) {
	if len(parts) == 0 {
		return
	}
	m := map[string][]int32{}
	for _, p := range parts {
		m[p.tp.topic] = append(m[p.tp.topic], p.tp.partition)
	}
	cl.ResumeFetchPartitions(m)
}

// commitLoop commits finished offsets every CommitInterval until the Subscriber
// stops.
func (s *Subscriber) commitLoop() {
	defer s.loops.Done()
	t := time.NewTicker(s.cfg.CommitInterval)
	defer t.Stop()
	for {
		select {
		case <-s.pollCtx.Done():
			return
		case <-t.C:
			s.mu.Lock()
			parts := slices.Collect(maps.Values(s.parts))
			s.mu.Unlock()
			ctx, cancel := context.WithTimeout(s.lc.Hard(), s.cfg.CommitTimeout)
			s.commit(ctx, s.cl, parts)
			cancel()
		}
	}
}

// commit commits through cl the finished offset of each partition that moved since
// its last commit. ctx bounds the commit.
func (s *Subscriber) commit(ctx context.Context, cl *kgo.Client, parts []*partition) {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	offsets := map[string]map[int32]kgo.EpochOffset{}
	byTP := map[topicPartition]*partition{}
	for _, p := range parts {
		eo, ok := p.uncommitted()
		if !ok {
			continue
		}
		if offsets[p.tp.topic] == nil {
			offsets[p.tp.topic] = map[int32]kgo.EpochOffset{}
		}
		offsets[p.tp.topic][p.tp.partition] = eo
		byTP[p.tp] = p
	}
	if len(offsets) == 0 {
		return
	}
	var errs []error
	cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			errs = append(errs, err)
			return
		}
		for _, t := range resp.Topics {
			for _, rp := range t.Partitions {
				tp := topicPartition{t.Topic, rp.Partition}
				p := byTP[tp]
				if p == nil {
					continue
				}
				if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
					errs = append(errs, fmt.Errorf("%s/%d: %w", tp.topic, tp.partition, err))
					continue
				}
				p.committedUpTo(offsets[tp.topic][tp.partition].Offset)
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		s.commitErrors.Add(1)
		// The records are done, only their offsets are not recorded: the next
		// commit includes them, and a re-read finds duplicates.
		s.log.Warn("offset commit failed", slog.Any("error", err))
		return
	}
	s.commits.Add(1)
}

// signalStop stops fetching and committing periodically, and tells every
// partition goroutine to start no other record.
func (s *Subscriber) signalStop() {
	s.mu.Lock()
	s.stopping = true
	for _, p := range s.parts {
		p.stop()
	}
	s.mu.Unlock()
	s.pollCancel()
	s.log.Info("subscriber stopping")
}

// shutdown, once the Subscriber begins to stop, stops the loops and waits for
// them, lets the client leave the group — revoked then waits for every partition
// goroutine and commits — and closes it. It runs under the lifecycle, so that
// Hard ends only at a hard stop while it waits.
func (s *Subscriber) shutdown() {
	<-s.lc.Stopping()
	s.signalStop()
	s.loops.Wait()
	// Leaving the group revokes every partition (s.revoked), unless they were
	// lost; polls have stopped, so the client may rebalance at once.
	s.cl.CloseAllowingRebalance()
	// Nothing is left, unless the client never called back.
	stopAll(s.detachFunc(func(topicPartition) bool { return true }))
	s.workers.Wait()
}

// stopped is the lifecycle's Stopped hook: the client has left the group.
func (s *Subscriber) stopped(bool) {
	st := s.Stats()
	s.log.Info("subscriber stopped", slog.Int64("acked", st.Acked), slog.Int64("retried", st.Retried),
		slog.Int64("terminated", st.Terminated), slog.Int64("skipped", st.Skipped), slog.Int64("commit_errors", st.CommitErrors))
}

// Stopping is closed when the subscriber begins to stop (Stop, or the end of
// Start's context): from then on it starts no new delivery.
func (s *Subscriber) Stopping() <-chan struct{} { return s.lc.Stopping() }

// Stop shuts the Subscriber down gracefully: it stops fetching, lets the records
// being processed finish (commit, or roll back), abandons retries, commits the
// offsets of every finished record, and leaves the group so that its partitions
// go to other members at once. If ctx ends first, the stop turns hard: in-flight
// transactions are abandoned (rolled back; their records are re-read by the next
// owner), finished offsets are still committed (within Config.CommitTimeout),
// and ctx's error is returned once the client has left the group.
//
// Stop follows the one rule of pgoutbox's services (package internal/lifecycle):
// it may be called any number of times, from any goroutine, each call waiting
// for the same shutdown; before Start it returns nil and the Subscriber can no
// longer start.
func (s *Subscriber) Stop(ctx context.Context) error {
	return s.lc.Stop(ctx)
}
