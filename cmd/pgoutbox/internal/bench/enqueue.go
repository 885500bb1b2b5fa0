package bench

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/redact"
)

// EnqueueResult is the enqueue scenario: commits/s of a small business transaction
// without and with one outbox event, with NOTIFY on and off.
type EnqueueResult struct {
	Method    string  `json:"method"`
	DurationS float64 `json:"duration_s"`
	// Rounds is how many interleaved slices each cell's DurationS was split into.
	Rounds int           `json:"rounds,omitempty"`
	Cells  []EnqueueCell `json:"cells"`
	Ratios EnqueueRatios `json:"ratios"`
	// PeerNotRun says why the real watermill-sql cells are missing and how to
	// build their binary; empty when they ran.
	PeerNotRun string `json:"peer_not_run,omitempty"`
	// RelayRSS is the relay of the "relay running" cells.
	RelayRSS  []RelayRSS `json:"relay_rss,omitempty"`
	MaxRSSMiB float64    `json:"max_rss_mib,omitempty"`
}

// EnqueueCell is one combination, timed for DurationS in Rounds slices.
type EnqueueCell struct {
	Producers int  `json:"producers"`
	Outbox    bool `json:"outbox"`
	// Batched: the event rode in the business INSERT's round trip
	// (Producer.QueueTx) instead of a statement of its own (EnqueueTx).
	Batched bool `json:"batched,omitempty"`
	// Floor: no outbox, but the business INSERT and, in the same round trip, an
	// INSERT of the event's payload into a table that has only a primary key —
	// the least work any outbox adds to the transaction: one more row, with the
	// payload, written and committed with the business row.
	Floor bool `json:"floor,omitempty"`
	// Watermill: no outbox, but after the business INSERT, as a statement of its
	// own, what watermill-sql's publisher does in the transaction with its default
	// PostgreSQL schema: one INSERT into a table with a bigserial primary key, a
	// uuid, created_at, the JSON payload and metadata, and transaction_id xid8
	// defaulting to pg_current_xact_id() (a table of the bench's own, approximated
	// from that public description).
	Watermill bool `json:"watermill,omitempty"`
	// WatermillSQL: no outbox, but after the business INSERT the real
	// watermill-sql (v4) publisher on the transaction behind watermill's
	// forwarder, in the peer process of Config.EnqueuePeerBin; its CPU is its
	// backends' and that process's own.
	WatermillSQL  bool    `json:"watermill_sql,omitempty"`
	Notify        bool    `json:"notify"`
	Relay         bool    `json:"relay"` // a relay (null broker) ran during the cell
	Commits       int64   `json:"commits"`
	Seconds       float64 `json:"seconds"`
	CommitsPerSec float64 `json:"commits_per_s"`
	P50Ms         float64 `json:"p50_ms"`
	P99Ms         float64 `json:"p99_ms"`
	// RoundCommitsPerSec is the cell's commits/s in each round, in order.
	RoundCommitsPerSec []float64 `json:"round_commits_per_s,omitempty"`
	// CPUUsPerCommit is the CPU time per commit of the producers' PostgreSQL
	// backends (from /proc/<pid>/schedstat) plus the bench process's own, in
	// µs, and RoundCPUUsPerCommit the same per round. Other processes on the
	// machine do not add to it, so its ratios hold on a busy machine where
	// commits/s do not. Zero when the backends' /proc cannot be read (a remote
	// server) and in the relay cells (the relay's CPU is not counted).
	CPUUsPerCommit       float64   `json:"cpu_us_per_commit,omitempty"`
	ServerCPUUsPerCommit float64   `json:"server_cpu_us_per_commit,omitempty"`
	RoundCPUUsPerCommit  []float64 `json:"round_cpu_us_per_commit,omitempty"`

	cpuSum, serverSum float64 // ns over the rounds, while they are being run
}

// EnqueueRatios compare cells. Time ratios are (time per commit with) / (without):
// 1.10 means the outbox makes the transaction 10% slower. Each is the median of
// the ratios of the rounds, in which the compared cells ran side by side.
type EnqueueRatios struct {
	OutboxTimeRatio1  float64 `json:"outbox_time_ratio_1"`  // 1 producer, NOTIFY on, EnqueueTx
	OutboxTimeRatio16 float64 `json:"outbox_time_ratio_16"` // 16 producers, NOTIFY on, EnqueueTx
	// The same with QueueTx: the event in the business INSERT's round trip.
	BatchedTimeRatio1  float64 `json:"batched_time_ratio_1,omitempty"`
	BatchedTimeRatio16 float64 `json:"batched_time_ratio_16,omitempty"`
	// The same for the floor cells: what one more row with the payload costs.
	FloorTimeRatio1  float64 `json:"floor_time_ratio_1,omitempty"`
	FloorTimeRatio16 float64 `json:"floor_time_ratio_16,omitempty"`
	// The same for the watermill-like cells: a bigserial-keyed INSERT of the
	// payload, as watermill-sql's publisher does.
	WatermillTimeRatio1  float64 `json:"watermill_time_ratio_1,omitempty"`
	WatermillTimeRatio16 float64 `json:"watermill_time_ratio_16,omitempty"`
	// EnqueueTx and QueueTx against the watermill-like cell, run side by side:
	// time per commit with EnqueueTx (QueueTx) / with the watermill-like INSERT.
	EnqueueVsWatermill1  float64 `json:"enqueue_vs_watermill_1,omitempty"`
	EnqueueVsWatermill16 float64 `json:"enqueue_vs_watermill_16,omitempty"`
	BatchedVsWatermill1  float64 `json:"batched_vs_watermill_1,omitempty"`
	BatchedVsWatermill16 float64 `json:"batched_vs_watermill_16,omitempty"`
	// The same for the real watermill-sql cells (EnqueueCell.WatermillSQL): time
	// per commit with it / without an outbox, and EnqueueTx (QueueTx) / it.
	WatermillSQLTimeRatio1  float64 `json:"watermill_sql_time_ratio_1,omitempty"`
	WatermillSQLTimeRatio16 float64 `json:"watermill_sql_time_ratio_16,omitempty"`
	EnqueueVsWatermillSQL1  float64 `json:"enqueue_vs_watermill_sql_1,omitempty"`
	EnqueueVsWatermillSQL16 float64 `json:"enqueue_vs_watermill_sql_16,omitempty"`
	BatchedVsWatermillSQL1  float64 `json:"batched_vs_watermill_sql_1,omitempty"`
	BatchedVsWatermillSQL16 float64 `json:"batched_vs_watermill_sql_16,omitempty"`
	// NotifyCost16 is the share of commits/s NOTIFY costs at 16 producers while a
	// relay runs (producers may notify only when a relay listens):
	// 1 − (NOTIFY on) / (NOTIFY off).
	NotifyCost16 float64 `json:"notify_cost_16"`
	// NotifyCost16NoRelay and NotifyCost1NoRelay are the same without a relay.
	NotifyCost16NoRelay float64 `json:"notify_cost_16_no_relay"`
	NotifyCost1NoRelay  float64 `json:"notify_cost_1_no_relay"`
	// Ranges holds the smallest and largest per-round value of each figure
	// above, under its JSON name.
	Ranges map[string][2]float64 `json:"ranges,omitempty"`
	// CPU holds, under the same JSON names as the time ratios above, the
	// ratios of CPU per commit (EnqueueCell.CPUUsPerCommit) of the same cells:
	// the median of the rounds' ratios, and CPURanges their range. Empty when
	// the CPU could not be read.
	CPU       map[string]float64    `json:"cpu,omitempty"`
	CPURanges map[string][2]float64 `json:"cpu_ranges,omitempty"`
}

const enqueueMethod = "Each producer loops BEGIN; INSERT one row into a business table (orders); " +
	"[Producer.EnqueueTx one event with a ~payload-bytes JSON payload;] COMMIT, on its own " +
	"connection; the batched cells send the INSERT and the event's statement " +
	"(Producer.QueueTx) in one round trip, so the transaction has as many round trips as " +
	"without the outbox. The floor cells send, in that round trip, an INSERT of the same " +
	"JSON payload into a table with only a primary key instead of the event: the least any " +
	"outbox adds. The watermill-like cells send, after the business INSERT and as a statement of " +
	"its own, what watermill-sql's publisher does in the transaction: one INSERT into a table " +
	"with a bigserial primary key (\"offset\"), a uuid, created_at, the JSON payload, metadata, " +
	"and transaction_id xid8 DEFAULT pg_current_xact_id() (approximating its default PostgreSQL " +
	"schema). The watermill-sql cells (when --enqueue-peer-bin is given) run the same business INSERT " +
	"and then the real watermill-sql v4 publisher on the transaction behind watermill's forwarder (its outbox " +
	"pattern: the message in a JSON envelope, one INSERT into its default PostgreSQL schema's table) in a " +
	"subprocess with connections of its own; their CPU is that process's and its backends'. NOTIFY off sets pgoutbox.notify = 'off' on the producers' " +
	"connections. Each cell's duration is split into rounds; every round runs every cell " +
	"in turn (from empty tables), and each ratio is the median of its per-round ratios, so " +
	"a drift of the machine's speed hits both sides of a ratio alike. The cells without a " +
	"relay measure the producers' cost alone. The two relay cells then run 16 producers " +
	"while one relay (null broker) drains the outbox as it fills, because producers may " +
	"notify only when a relay listens (or is idle); NOTIFY's cost is taken from that pair."

// enqueueSpec is what a cell runs.
type enqueueSpec struct {
	producers                             int
	outbox, batched, floor, notify, relay bool
	watermill, peer                       bool
}

func (sp enqueueSpec) label() string {
	var l string
	switch {
	case sp.floor:
		l = fmt.Sprintf("%d producer(s), floor: a row of the payload alone", sp.producers)
	case sp.watermill:
		l = fmt.Sprintf("%d producer(s), %s", sp.producers, watermillName)
	case sp.peer:
		l = fmt.Sprintf("%d producer(s), %s", sp.producers, peerName)
	case !sp.outbox:
		l = fmt.Sprintf("%d producer(s), no outbox", sp.producers)
	default:
		l = fmt.Sprintf("%d producer(s), outbox on, NOTIFY %s", sp.producers, onOff(sp.notify))
	}
	if sp.batched {
		l += ", batched with the INSERT"
	}
	if sp.relay {
		l += ", relay running"
	}
	return l
}

// enqueue runs the enqueue scenario: the producers' cells in interleaved rounds,
// then the two cells with a relay running.
func (r *Runner) enqueue(ctx context.Context) (*EnqueueResult, error) {
	s, err := r.newSchema(ctx, "enqueue")
	if err != nil {
		return nil, err
	}
	defer r.dropSchema(s)
	e, err := r.newEnqueueBench(ctx, s)
	if err != nil {
		return nil, err
	}
	defer e.close()
	if err := e.phase(ctx, e.specs(), nil); err != nil {
		return e.res, err
	}
	if err := e.relayPhase(ctx); err != nil {
		return e.res, err
	}
	e.res.Ratios = e.res.ratios()
	return e.res, nil
}

// specs are the cells without a relay (enqueueSpecs), with the real
// watermill-sql's when there is a peer binary; without one, the result says
// that those cells were not run and how to build it.
func (e *enqueueBench) specs() []enqueueSpec {
	peer := e.r.cfg.EnqueuePeerBin != ""
	if !peer {
		e.res.PeerNotRun = peerNotRun
	}
	return enqueueSpecs(peer)
}

// enqueueSpecs are the cells without a relay: for 1 and 16 producers, no
// outbox, the outbox with NOTIFY on and off, batched, the floor, the
// watermill-like INSERT and, with peer, the real watermill-sql.
func enqueueSpecs(peer bool) []enqueueSpec {
	var specs []enqueueSpec
	for _, n := range []int{1, 16} {
		specs = append(specs, enqueueSpec{producers: n, notify: true}, enqueueSpec{producers: n, outbox: true, notify: true},
			enqueueSpec{producers: n, outbox: true}, enqueueSpec{producers: n, outbox: true, batched: true, notify: true},
			enqueueSpec{producers: n, floor: true, notify: true}, enqueueSpec{producers: n, watermill: true, notify: true})
		if peer {
			specs = append(specs, enqueueSpec{producers: n, peer: true, notify: true})
		}
	}
	return specs
}

// enqueueBench is one run of the enqueue scenario: its schema's business
// tables, the producer, and a pool of producer connections per NOTIFY setting.
type enqueueBench struct {
	r       *Runner
	s       *outboxSchema
	orders  string // the business table
	floor   string // the floor cells' table: a primary key and the payload
	wm      string // the watermill-like cells' table
	insert  string // the business statement, with the row id as $1
	prod    *pgoutbox.Producer
	pools   map[bool]*pgxpool.Pool // by NOTIFY on
	payload map[string]any
	next    atomic.Int64 // the last business row's id
	res     *EnqueueResult
	// backends are the producer pools' backend processes, by NOTIFY on; nil
	// when their /proc/<pid>/schedstat cannot be read.
	backends map[bool][]int
}

// newEnqueueBench creates the business tables in s and connects the producers.
func (r *Runner) newEnqueueBench(ctx context.Context, s *outboxSchema) (*enqueueBench, error) {
	c := r.cfg
	e := &enqueueBench{r: r, s: s, orders: pgx.Identifier{s.name, "orders"}.Sanitize(), floor: pgx.Identifier{s.name, "floor_events"}.Sanitize(),
		wm:    pgx.Identifier{s.name, "watermill_messages"}.Sanitize(),
		pools: map[bool]*pgxpool.Pool{}, res: &EnqueueResult{Method: enqueueMethod, DurationS: c.Duration.Seconds(), Rounds: c.EnqueueRounds}}
	e.insert = "INSERT INTO " + e.orders + " VALUES ($1, 'c-42', 1999)"
	if _, err := r.admin.Exec(ctx, "CREATE TABLE "+e.orders+" (id bigint PRIMARY KEY, customer text NOT NULL, total_cents int NOT NULL); "+
		"CREATE TABLE "+e.floor+" (id bigint PRIMARY KEY, payload jsonb NOT NULL); "+
		"CREATE TABLE "+e.wm+` ("offset" bigserial PRIMARY KEY, uuid varchar(36) NOT NULL, created_at timestamp NOT NULL DEFAULT now(), `+
		`payload json DEFAULT NULL, metadata json DEFAULT NULL, transaction_id xid8 NOT NULL DEFAULT pg_current_xact_id())`); err != nil {
		return nil, fmt.Errorf("create business tables: %w", err)
	}
	var err error
	if e.prod, err = pgoutbox.NewProducer(&pgoutbox.Config{Schema: s.name}); err != nil {
		return nil, err
	}
	for _, notify := range []bool{true, false} {
		p, err := r.producerPool(ctx, 16, notify)
		if err != nil {
			e.close()
			return nil, err
		}
		e.pools[notify] = p
		if pids := backendPids(ctx, p, 16); pids != nil {
			if e.backends == nil {
				e.backends = map[bool][]int{}
			}
			e.backends[notify] = pids
		}
	}
	if len(e.backends) != 2 {
		e.backends = nil
	}
	e.payload = map[string]any{"customer": "c-42", "total_cents": 1999, "pad": string(make([]byte, 0))}
	if pad := c.PayloadBytes - 50; pad > 0 {
		b := make([]byte, pad)
		for i := range b {
			b[i] = 'x'
		}
		e.payload["pad"] = string(b)
	}
	return e, nil
}

// producerPool opens conns producer connections, with pgoutbox.notify off
// unless notify.
func (r *Runner) producerPool(ctx context.Context, conns int, notify bool) (*pgxpool.Pool, error) {
	return producerPoolOn(ctx, r.cfg.DatabaseURL, conns, notify)
}

// producerPoolOn is producerPool on the database of dbURL.
func producerPoolOn(ctx context.Context, dbURL string, conns int, notify bool) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, redact.ConnStringError("database URL", err)
	}
	pc.MaxConns, pc.MinConns = int32(conns), int32(conns)
	if !notify {
		pc.ConnConfig.RuntimeParams["pgoutbox.notify"] = "off"
	}
	p, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect producers: %w", err)
	}
	return p, nil
}

// backendPids returns the PostgreSQL process ids of pool's n connections, or nil
// if their on-CPU time cannot be read from /proc (a server on another machine,
// or not Linux).
func backendPids(ctx context.Context, pool *pgxpool.Pool, n int) []int {
	conns, release, err := acquireAll(ctx, pool, n)
	defer release()
	if err != nil {
		return nil
	}
	var pids []int
	for _, c := range conns {
		var pid int
		if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			return nil
		}
		if _, ok := schedNs(pid); !ok {
			return nil
		}
		pids = append(pids, pid)
	}
	return pids
}

// acquireAll holds n distinct connections of pool (acquired one after another
// and released one by one, the pool would hand back the same connection) until
// release is called; release is safe to call after an error too.
func acquireAll(ctx context.Context, pool *pgxpool.Pool, n int) (conns []*pgxpool.Conn, release func(), err error) {
	release = func() {
		for _, c := range conns {
			c.Release()
		}
	}
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return conns, release, err
		}
		conns = append(conns, c)
	}
	return conns, release, nil
}

// schedNs is the on-CPU time of process pid in ns, from /proc/<pid>/schedstat.
func schedNs(pid int) (float64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	return v, err == nil
}

// cpuNs is the on-CPU time so far of pids (server) and of this process
// (client), in ns; ok is false if one could not be read (a backend gone).
func cpuNs(pids []int) (server, client float64, ok bool) {
	for _, pid := range pids {
		v, ok := schedNs(pid)
		if !ok {
			return 0, 0, false
		}
		server += v
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0, false
	}
	return server, float64(ru.Utime.Nano() + ru.Stime.Nano()), true
}

// close closes the producers' pools.
func (e *enqueueBench) close() {
	for _, notify := range []bool{false, true} {
		if p := e.pools[notify]; p != nil {
			p.Close()
		}
	}
}

// tx1 commits one business transaction as sp says: the business row, and the
// event (EnqueueTx, or QueueTx in the INSERT's round trip) or the floor's row.
func (e *enqueueBench) tx1(ctx context.Context, pool *pgxpool.Pool, sp enqueueSpec) error {
	id := e.next.Add(1)
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if sp.batched || sp.floor {
			b := &pgx.Batch{}
			b.Queue(e.insert, id)
			if sp.floor {
				// Encoded per transaction, as the producer encodes each event.
				doc, err := json.Marshal(e.payload)
				if err != nil {
					return err
				}
				b.Queue("INSERT INTO "+e.floor+" VALUES ($1, $2)", id, string(doc))
			} else if _, err := e.prod.QueueTx(ctx, b, pgoutbox.Event{AggregateType: "order", AggregateID: strconv.FormatInt(id, 10),
				EventType: "order.placed", Payload: e.payload}); err != nil {
				return err
			}
			return tx.SendBatch(ctx, b).Close()
		}
		if _, err := tx.Exec(ctx, e.insert, id); err != nil {
			return err
		}
		if sp.watermill {
			// Encoded per transaction, as a publisher marshals each message.
			doc, err := json.Marshal(e.payload)
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, "INSERT INTO "+e.wm+" (uuid, payload, metadata) VALUES ($1, $2, $3)", newUUID(), string(doc), `{"name":"order.placed"}`)
			return err
		}
		if sp.outbox {
			_, err := e.prod.EnqueueTx(ctx, tx, pgoutbox.Event{AggregateType: "order", AggregateID: strconv.FormatInt(id, 10),
				EventType: "order.placed", Payload: e.payload})
			return err
		}
		return nil
	})
}

// slice runs sp for d and adds what it measured to cell and hist; procs are
// the relays running meanwhile, sampled at the end.
func (e *enqueueBench) slice(ctx context.Context, sp enqueueSpec, d time.Duration, cell *EnqueueCell, hist *hdrhistogram.Histogram, round string, procs []*relayProc) error {
	if sp.peer {
		return e.peerSlice(ctx, sp, d, cell, hist, round)
	}
	pool := e.pools[sp.notify]
	label := sp.label()
	e.r.prog.step("enqueue%s: %s", round, label)
	// Warm every connection's statement cache before timing.
	for range sp.producers {
		if err := e.tx1(ctx, pool, sp); err != nil {
			return fmt.Errorf("%s: warm-up: %w", label, err)
		}
	}
	var commits atomic.Int64
	pids := e.backends[sp.notify]
	if sp.relay {
		pids = nil
	}
	server0, client0, cpuOK := cpuNs(pids)
	cpuOK = cpuOK && pids != nil
	hists := make([]*hdrhistogram.Histogram, sp.producers)
	errs := make([]error, sp.producers)
	start := time.Now()
	stop := start.Add(d)
	var wg sync.WaitGroup
	for i := range sp.producers {
		hists[i] = hdrhistogram.New(1, 60_000_000, 3)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) && ctx.Err() == nil {
				t := time.Now()
				if err := e.tx1(ctx, pool, sp); err != nil {
					errs[i] = err
					return
				}
				_ = hists[i].RecordValue(time.Since(t).Microseconds())
				commits.Add(1)
			}
		}()
	}
	e.showProgress(ctx, label, round, start, d, &commits)
	wg.Wait()
	el := time.Since(start)
	for _, err := range errs {
		if err != nil {
			return fmt.Errorf("%s: %w", label, err)
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := sampleAll(procs); err != nil {
		return err
	}
	for _, x := range hists {
		hist.Merge(x)
	}
	n := commits.Load()
	if server1, client1, ok := cpuNs(pids); cpuOK && ok && n > 0 {
		cell.serverSum += server1 - server0
		cell.cpuSum += server1 - server0 + client1 - client0
		cell.RoundCPUUsPerCommit = append(cell.RoundCPUUsPerCommit, round2((server1-server0+client1-client0)/1000/float64(n)))
	}
	cell.Commits += n
	cell.Seconds += el.Seconds()
	cell.RoundCommitsPerSec = append(cell.RoundCommitsPerSec, round2(float64(n)/el.Seconds()))
	return nil
}

// showProgress reports the slice's commits/s every 250ms until d has passed
// since start or ctx ends.
func (e *enqueueBench) showProgress(ctx context.Context, label, round string, start time.Time, d time.Duration, commits *atomic.Int64) {
	for done := false; !done; {
		select {
		case <-time.After(250 * time.Millisecond):
			el := time.Since(start)
			e.r.prog.update("enqueue%s: %s: %.0f commits/s (%.0fs left)", round, label, float64(commits.Load())/el.Seconds(),
				max(0, (d-el).Seconds()))
			done = el >= d
		case <-ctx.Done():
			done = true
		}
	}
}

// phase runs specs in EnqueueRounds interleaved rounds, each from empty tables,
// and adds their cells to the result.
func (e *enqueueBench) phase(ctx context.Context, specs []enqueueSpec, procs []*relayProc) error {
	c := e.r.cfg
	cells := make([]EnqueueCell, len(specs))
	hists := make([]*hdrhistogram.Histogram, len(specs))
	for i, sp := range specs {
		cells[i] = EnqueueCell{Producers: sp.producers, Outbox: sp.outbox, Batched: sp.batched, Floor: sp.floor, Watermill: sp.watermill, WatermillSQL: sp.peer, Notify: sp.notify, Relay: sp.relay}
		hists[i] = hdrhistogram.New(1, 60_000_000, 3)
	}
	d := c.Duration / time.Duration(c.EnqueueRounds)
	for round := range c.EnqueueRounds {
		if _, err := e.r.admin.Exec(ctx, "TRUNCATE "+e.s.events+", "+e.s.seqs+", "+e.orders+", "+e.floor+", "+e.wm); err != nil {
			return fmt.Errorf("empty the tables: %w", err)
		}
		tag := ""
		if c.EnqueueRounds > 1 {
			tag = fmt.Sprintf(" (round %d/%d)", round+1, c.EnqueueRounds)
		}
		for i, sp := range specs {
			if err := e.slice(ctx, sp, d, &cells[i], hists[i], tag, procs); err != nil {
				return err
			}
		}
	}
	for i := range cells {
		cl := &cells[i]
		cl.CommitsPerSec = round2(float64(cl.Commits) / cl.Seconds)
		cl.Seconds = round3(cl.Seconds)
		cl.P50Ms = round3(float64(hists[i].ValueAtQuantile(50)) / 1000)
		cl.P99Ms = round3(float64(hists[i].ValueAtQuantile(99)) / 1000)
		if len(cl.RoundCPUUsPerCommit) == len(cl.RoundCommitsPerSec) && cl.Commits > 0 {
			cl.CPUUsPerCommit = round2(cl.cpuSum / 1000 / float64(cl.Commits))
			cl.ServerCPUUsPerCommit = round2(cl.serverSum / 1000 / float64(cl.Commits))
		} else {
			cl.RoundCPUUsPerCommit = nil // a round could not be read: no figure rather than a partial one
		}
	}
	e.res.Cells = append(e.res.Cells, cells...)
	return nil
}

// relayPhase runs the two cells of 16 producers (NOTIFY on and off) while one
// relay (null broker) drains the outbox, and records the relay's RSS.
func (e *enqueueBench) relayPhase(ctx context.Context) error {
	null, err := e.r.broker(ctx, "null")
	if err != nil {
		return err
	}
	procs, err := e.r.startRelays(ctx, 1, relayOpts{schema: e.s.name, broker: null})
	defer func() { _ = stopRelays(procs) }()
	if err != nil {
		return err
	}
	if err := e.phase(ctx, []enqueueSpec{{producers: 16, outbox: true, notify: true, relay: true}, {producers: 16, outbox: true, relay: true}}, procs); err != nil {
		return err
	}
	if err := stopRelays(procs); err != nil {
		return err
	}
	e.res.RelayRSS = rssOf(procs)
	e.res.MaxRSSMiB = maxRSSMiB(e.res.RelayRSS)
	procs = nil
	return nil
}

// ratios compares the cells round by round.
func (res *EnqueueResult) ratios() EnqueueRatios {
	out := EnqueueRatios{Ranges: map[string][2]float64{}, CPU: map[string]float64{}, CPURanges: map[string][2]float64{}}
	// timeRatio is the median per-round ratio of base's commits/s to other's.
	timeRatio := func(name string, dst *float64, base, other *EnqueueCell) {
		if base == nil || other == nil || len(base.RoundCommitsPerSec) != len(other.RoundCommitsPerSec) || len(base.RoundCommitsPerSec) == 0 {
			return
		}
		xs := make([]float64, len(base.RoundCommitsPerSec))
		for i := range xs {
			xs[i] = ratio(base.RoundCommitsPerSec[i], other.RoundCommitsPerSec[i])
		}
		*dst = round3(median(xs))
		out.Ranges[name] = [2]float64{round3(slices.Min(xs)), round3(slices.Max(xs))}
		// The same cells' CPU per commit, other / base, when both were read.
		if n := len(base.RoundCPUUsPerCommit); n > 0 && n == len(other.RoundCPUUsPerCommit) {
			cs := make([]float64, n)
			for i := range cs {
				cs[i] = ratio(other.RoundCPUUsPerCommit[i], base.RoundCPUUsPerCommit[i])
			}
			out.CPU[name] = round3(median(cs))
			out.CPURanges[name] = [2]float64{round3(slices.Min(cs)), round3(slices.Max(cs))}
		}
	}
	// cost is 1 − the median per-round ratio of on's commits/s to off's.
	cost := func(name string, dst *float64, on, off *EnqueueCell) {
		var t float64
		timeRatio(name, &t, off, on)
		if t == 0 {
			return
		}
		*dst = round3(1 - 1/t)
		delete(out.CPU, name) // a cost, not a ratio: its CPU side would read the other way round
		delete(out.CPURanges, name)
		rg := out.Ranges[name]
		out.Ranges[name] = [2]float64{round3(1 - 1/rg[0]), round3(1 - 1/rg[1])}
	}
	none := func(p int) *EnqueueCell { return res.cell(enqueueSpec{producers: p, notify: true}) }
	enq := func(p int, notify, relay bool) *EnqueueCell {
		return res.cell(enqueueSpec{producers: p, outbox: true, notify: notify, relay: relay})
	}
	timeRatio("outbox_time_ratio_1", &out.OutboxTimeRatio1, none(1), enq(1, true, false))
	timeRatio("outbox_time_ratio_16", &out.OutboxTimeRatio16, none(16), enq(16, true, false))
	timeRatio("batched_time_ratio_1", &out.BatchedTimeRatio1, none(1), res.cell(enqueueSpec{producers: 1, outbox: true, batched: true, notify: true}))
	timeRatio("batched_time_ratio_16", &out.BatchedTimeRatio16, none(16), res.cell(enqueueSpec{producers: 16, outbox: true, batched: true, notify: true}))
	timeRatio("floor_time_ratio_1", &out.FloorTimeRatio1, none(1), res.cell(enqueueSpec{producers: 1, floor: true, notify: true}))
	timeRatio("floor_time_ratio_16", &out.FloorTimeRatio16, none(16), res.cell(enqueueSpec{producers: 16, floor: true, notify: true}))
	wm := func(p int) *EnqueueCell { return res.cell(enqueueSpec{producers: p, watermill: true, notify: true}) }
	batched := func(p int) *EnqueueCell {
		return res.cell(enqueueSpec{producers: p, outbox: true, batched: true, notify: true})
	}
	timeRatio("watermill_time_ratio_1", &out.WatermillTimeRatio1, none(1), wm(1))
	timeRatio("watermill_time_ratio_16", &out.WatermillTimeRatio16, none(16), wm(16))
	timeRatio("enqueue_vs_watermill_1", &out.EnqueueVsWatermill1, wm(1), enq(1, true, false))
	timeRatio("enqueue_vs_watermill_16", &out.EnqueueVsWatermill16, wm(16), enq(16, true, false))
	timeRatio("batched_vs_watermill_1", &out.BatchedVsWatermill1, wm(1), batched(1))
	timeRatio("batched_vs_watermill_16", &out.BatchedVsWatermill16, wm(16), batched(16))
	wms := func(p int) *EnqueueCell { return res.cell(enqueueSpec{producers: p, peer: true, notify: true}) }
	timeRatio("watermill_sql_time_ratio_1", &out.WatermillSQLTimeRatio1, none(1), wms(1))
	timeRatio("watermill_sql_time_ratio_16", &out.WatermillSQLTimeRatio16, none(16), wms(16))
	timeRatio("enqueue_vs_watermill_sql_1", &out.EnqueueVsWatermillSQL1, wms(1), enq(1, true, false))
	timeRatio("enqueue_vs_watermill_sql_16", &out.EnqueueVsWatermillSQL16, wms(16), enq(16, true, false))
	timeRatio("batched_vs_watermill_sql_1", &out.BatchedVsWatermillSQL1, wms(1), batched(1))
	timeRatio("batched_vs_watermill_sql_16", &out.BatchedVsWatermillSQL16, wms(16), batched(16))
	if len(out.CPU) == 0 {
		out.CPU, out.CPURanges = nil, nil
	}
	cost("notify_cost_1_no_relay", &out.NotifyCost1NoRelay, enq(1, true, false), enq(1, false, false))
	cost("notify_cost_16_no_relay", &out.NotifyCost16NoRelay, enq(16, true, false), enq(16, false, false))
	cost("notify_cost_16", &out.NotifyCost16, enq(16, true, true), enq(16, false, true))
	return out
}

// peerRatios are the ratios of one peer's cells (the watermill-like INSERT, or
// the real watermill-sql): their JSON names are key+"_time_ratio_N",
// "enqueue_vs_"+key+"_N" and "batched_vs_"+key+"_N".
type peerRatios struct {
	name, key string
	// enqueueMax is EnqueueTx / the peer's target; QueueTx's is 1.0.
	enqueueMax float64
	at         []peerRatiosAt // 1 and 16 producers
}

// peerRatiosAt is a peer's ratios at n producers; suffix ends their JSON names.
type peerRatiosAt struct {
	n                      int
	suffix                 string
	time, enqueue, batched float64
}

// peers are the ratios of the peers' cells. Issue 19 set EnqueueTx against the
// watermill-like INSERT at ≤ 1.1; issue 37, against the real watermill-sql, ≤ 1.0.
func (rt EnqueueRatios) peers() []peerRatios {
	return []peerRatios{
		{name: watermillName, key: "watermill", enqueueMax: 1.1, at: []peerRatiosAt{
			{1, "_1", rt.WatermillTimeRatio1, rt.EnqueueVsWatermill1, rt.BatchedVsWatermill1},
			{16, "_16", rt.WatermillTimeRatio16, rt.EnqueueVsWatermill16, rt.BatchedVsWatermill16}}},
		{name: peerName, key: "watermill_sql", enqueueMax: 1.0, at: []peerRatiosAt{
			{1, "_1", rt.WatermillSQLTimeRatio1, rt.EnqueueVsWatermillSQL1, rt.BatchedVsWatermillSQL1},
			{16, "_16", rt.WatermillSQLTimeRatio16, rt.EnqueueVsWatermillSQL16, rt.BatchedVsWatermillSQL16}}},
	}
}

// formatCPU prints the CPU ratio of name and its per-round range, or "–" if
// there is none.
func (rt EnqueueRatios) formatCPU(name string) string {
	v, ok := rt.CPU[name]
	if !ok {
		return "–"
	}
	rg := rt.CPURanges[name]
	return fmt.Sprintf("%.2f (%.2f–%.2f)", v, rg[0], rg[1])
}

// format prints a ratio and, when known, its per-round range.
func (rt EnqueueRatios) format(name string, v float64) string {
	if rg, ok := rt.Ranges[name]; ok {
		return fmt.Sprintf("%.2f (%.2f–%.2f)", v, rg[0], rg[1])
	}
	return fmt.Sprintf("%.2f", v)
}

// cell is the cell sp ran, nil if it did not run.
func (res *EnqueueResult) cell(sp enqueueSpec) *EnqueueCell {
	for i := range res.Cells {
		cl := &res.Cells[i]
		if cl.Producers == sp.producers && cl.Outbox == sp.outbox && cl.Batched == sp.batched && cl.Floor == sp.floor && cl.Watermill == sp.watermill && cl.WatermillSQL == sp.peer &&
			(!sp.outbox || cl.Notify == sp.notify) && cl.Relay == sp.relay {
			return cl
		}
	}
	return nil
}

// outboxLabel says how the cell enqueued: no, yes (EnqueueTx) or batched (QueueTx).
func (cl EnqueueCell) outboxLabel() string {
	switch {
	case cl.Batched:
		return "batched"
	case cl.Floor:
		return "floor"
	case cl.Watermill:
		return "watermill-like"
	case cl.WatermillSQL:
		return "watermill-sql"
	case cl.Outbox:
		return "yes"
	}
	return "no"
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// watermillName names the watermill-like cells in tables and targets.
const watermillName = "watermill-like insert (bigserial + payload)"

// newUUID is a random version-4 UUID in its text form, as a publisher gives
// each message.
func newUUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}
