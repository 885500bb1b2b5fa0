package kafka_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/kafka"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.DiscardHandler)

// cluster is an in-process Kafka cluster (kfake, which speaks the real protocol)
// of one test's own. A persistent one keeps its data in a directory, so the test
// can stop it and start it again on the same ports, as a broker restart.
type cluster struct {
	t     *testing.T
	opts  []kfake.Opt
	dir   string // "" unless persistent
	ports []int

	mu sync.Mutex
	c  *kfake.Cluster // nil while stopped
}

// newCluster starts a cluster of three brokers that create topics on first use,
// with 4 partitions unless opts say otherwise.
func newCluster(t *testing.T, persistent bool, opts ...kfake.Opt) *cluster {
	t.Helper()
	return newBareCluster(t, persistent, append([]kfake.Opt{kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(4)}, opts...)...)
}

// newBareCluster starts a cluster with kfake's defaults and opts.
func newBareCluster(t *testing.T, persistent bool, opts ...kfake.Opt) *cluster {
	t.Helper()
	c := &cluster{t: t, opts: opts}
	first := c.opts
	if persistent {
		c.dir = t.TempDir()
		first = append(slices.Clone(c.opts), kfake.DataDir(c.dir))
	}
	kc, err := kfake.NewCluster(first...)
	if err != nil {
		t.Fatalf("kfake.NewCluster: %v", err)
	}
	c.c = kc
	for _, a := range kc.ListenAddrs() {
		_, port, _ := net.SplitHostPort(a)
		n, _ := strconv.Atoi(port)
		c.ports = append(c.ports, n)
	}
	t.Cleanup(c.stop)
	return c
}

func (c *cluster) addrs() []string {
	out := make([]string, len(c.ports))
	for i, p := range c.ports {
		out[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
	}
	return out
}

func (c *cluster) url() string { return "kafka://" + strings.Join(c.addrs(), ",") }

// kfake returns the running cluster, for faults and controls.
func (c *cluster) kfake() *kfake.Cluster {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.c
}

func (c *cluster) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c != nil {
		c.c.Close()
		c.c = nil
	}
}

// start starts a stopped persistent cluster again on its ports, with its data.
func (c *cluster) start() error {
	if c.dir == "" {
		return errors.New("cluster is not persistent")
	}
	kc, err := kfake.NewCluster(append(slices.Clone(c.opts), kfake.DataDir(c.dir), kfake.Ports(c.ports...))...)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.c = kc
	return nil
}

// admin returns an admin client on the cluster, closed when the test ends.
func (c *cluster) admin() *kadm.Client {
	c.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.addrs()...))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// createTopic creates topic with partitions and the given configs.
func (c *cluster) createTopic(topic string, partitions int32, configs map[string]*string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.admin().CreateTopic(ctx, partitions, 1, configs, topic); err != nil {
		c.t.Fatalf("create topic %s: %v", topic, err)
	}
}

// dial returns a publisher on c, closed when the test ends.
func (c *cluster) dial(cfg kafka.Config) *kafka.Publisher {
	c.t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	p, err := kafka.Dial(c.t.Context(), c.url(), &cfg)
	if err != nil {
		c.t.Fatalf("Dial: %v", err)
	}
	c.t.Cleanup(func() { _ = p.Close() })
	return p
}

// readRecords returns every record of topics (all topics if none are given),
// ordered by topic, partition and offset: each partition in broker order.
func readRecords(ctx context.Context, addrs []string, topics ...string) ([]*kgo.Record, error) {
	admCl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		return nil, err
	}
	defer admCl.Close()
	adm := kadm.NewClient(admCl)
	if len(topics) == 0 {
		details, err := adm.ListTopics(ctx)
		if err != nil {
			return nil, fmt.Errorf("list topics: %w", err)
		}
		topics = details.Names()
	}
	if len(topics) == 0 {
		return nil, nil
	}
	starts, err := adm.ListStartOffsets(ctx, topics...)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("list start offsets: %w", err)
	}
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("list end offsets: %w", err)
	}
	// Read each non-empty partition from its start to the end listed now.
	type tp struct {
		topic string
		part  int32
	}
	end := map[tp]int64{}
	from := map[string]map[int32]kgo.Offset{}
	ends.Each(func(o kadm.ListedOffset) {
		start, _ := starts.Lookup(o.Topic, o.Partition)
		if o.Offset > start.Offset {
			end[tp{o.Topic, o.Partition}] = o.Offset
			if from[o.Topic] == nil {
				from[o.Topic] = map[int32]kgo.Offset{}
			}
			from[o.Topic][o.Partition] = kgo.NewOffset().At(start.Offset)
		}
	})
	if len(end) == 0 {
		return nil, nil
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumePartitions(from), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		return nil, err
	}
	defer cons.Close()
	var out []*kgo.Record
	for len(end) > 0 {
		fetches := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("read %d records, %d partitions unfinished: %w", len(out), len(end), err)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			k := tp{r.Topic, r.Partition}
			if e, ok := end[k]; ok && r.Offset < e {
				out = append(out, r)
				if r.Offset == e-1 {
					delete(end, k)
				}
			}
		})
	}
	slices.SortFunc(out, func(a, b *kgo.Record) int {
		return cmp.Or(strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	return out, nil
}

// readStored is readRecords as the conformance suite sees messages.
func readStored(ctx context.Context, addrs []string) ([]brokertest.Stored, error) {
	recs, err := readRecords(ctx, addrs)
	if err != nil {
		return nil, err
	}
	out := make([]brokertest.Stored, len(recs))
	for i, r := range recs {
		h := make(map[string]string, len(r.Headers))
		for _, rh := range r.Headers {
			h[rh.Key] = string(rh.Value)
		}
		out[i] = brokertest.Stored{Destination: r.Topic, Key: string(r.Key), Headers: h, Body: r.Value}
	}
	return out, nil
}

func header(r *kgo.Record, name string) string {
	for _, h := range r.Headers {
		if h.Key == name {
			return string(h.Value)
		}
	}
	return ""
}

func message(aggType, aggID string, seq int64) broker.Message {
	m := brokertest.Message(aggType, aggID, seq)
	m.EventType, m.SchemaVersion = "changed", 1
	m.Payload = []byte(fmt.Sprintf(`{"seq":%d}`, seq))
	return m
}

func publish(t *testing.T, p broker.Publisher, msgs ...broker.Message) []error {
	t.Helper()
	return brokertest.Publish(t, p, msgs...)
}

func read(t *testing.T, c *cluster, topics ...string) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	recs, err := readRecords(ctx, c.addrs(), topics...)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return recs
}
