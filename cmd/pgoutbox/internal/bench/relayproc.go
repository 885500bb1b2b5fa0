package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// relayProc is one `pgoutbox relay` subprocess.
type relayProc struct {
	id      string
	cmd     *exec.Cmd
	mu      sync.Mutex
	lines   []string // the last lines of its stderr, for error messages
	ready   chan struct{}
	done    chan struct{}
	waitErr error
	peakRSS int64 // bytes: VmHWM, the peak resident set, read while it runs
}

// relayOpts are the flags of one group of relays.
type relayOpts struct {
	schema   string
	dbURL    string // defaults to Config.DatabaseURL
	broker   *brokerEnv
	noNotify bool
	cdcSlot  string // non-empty: run the CDC source with this slot and publication
	// tenants or tenantsFile: serve many outboxes (relay --tenants or
	// --tenants-file) instead of --schema; env is added to the relay's
	// environment (the file's url_env variables).
	tenants     string
	tenantsFile string
	env         []string
	extra       []string
}

// startRelays starts n relays and returns once each logged that it is running.
func (r *Runner) startRelays(ctx context.Context, n int, o relayOpts) ([]*relayProc, error) {
	var procs []*relayProc
	for i := range n {
		id := fmt.Sprintf("bench-%s-%d", randHex(2), i+1)
		dbURL := o.dbURL
		if dbURL == "" {
			dbURL = r.cfg.DatabaseURL
		}
		// The database and broker URLs travel in the environment, not on the command
		// line, where ps and /proc/PID/cmdline would show their credentials.
		env := append(relayEnv(), "DATABASE_URL="+dbURL)
		env = append(env, o.env...)
		many := o.tenants != "" || o.tenantsFile != ""
		var args []string
		switch {
		case o.tenants != "":
			args = []string{"relay", "--tenants", o.tenants}
		case o.tenantsFile != "":
			args = []string{"relay", "--tenants-file", o.tenantsFile}
		default:
			args = []string{"relay", "--schema", o.schema}
		}
		args = append(args, "--id", id,
			"--batch-size", strconv.Itoa(r.cfg.BatchSize), "--poll-interval", r.cfg.PollInterval.String(),
			"--shutdown-timeout", "60s")
		args = append(args, o.broker.relayArgs(many)...)
		env = append(env, o.broker.relayEnv(&r.cfg, id)...)
		if o.noNotify {
			args = append(args, "--no-notify")
		}
		if o.cdcSlot != "" {
			args = append(args, "--source", "cdc", "--slot", o.cdcSlot, "--publication", o.cdcSlot)
		}
		args = append(args, r.cfg.RelayArgs...)
		args = append(args, o.extra...)
		p, err := r.startRelay(id, args, env)
		if err != nil {
			stopRelays(procs)
			return nil, err
		}
		procs = append(procs, p)
	}
	for _, p := range procs {
		select {
		case <-p.ready:
		case <-p.done:
			stopRelays(procs)
			return nil, fmt.Errorf("relay %s exited before starting: %v: %s", p.id, p.waitErr, p.tail())
		case <-time.After(60 * time.Second):
			stopRelays(procs)
			return nil, fmt.Errorf("relay %s did not start within 60s: %s", p.id, p.tail())
		case <-ctx.Done():
			stopRelays(procs)
			return nil, ctx.Err()
		}
	}
	return procs, nil
}

// startRelay runs the relay with args and env (relayEnv and the URLs).
func (r *Runner) startRelay(id string, args, env []string) (*relayProc, error) {
	cmd := exec.Command(r.cfg.Executable, args...)
	cmd.Env = env
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	cmd.Stdout = pw
	p := &relayProc{id: id, cmd: cmd, ready: make(chan struct{}), done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start relay %s: %w", r.cfg.Executable, err)
	}
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		var once sync.Once
		for sc.Scan() {
			l := sc.Text()
			p.mu.Lock()
			p.lines = append(p.lines, l)
			if len(p.lines) > 20 {
				p.lines = p.lines[len(p.lines)-20:]
			}
			p.mu.Unlock()
			if strings.Contains(l, "relay starting") {
				once.Do(func() { close(p.ready) })
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		p.waitErr = cmd.Wait()
		_ = pw.Close()
		close(p.done)
	}()
	return p, nil
}

// tails is each relay's tail, for an error that does not say which relay is at fault.
func tails(procs []*relayProc) string {
	var b strings.Builder
	for _, p := range procs {
		fmt.Fprintf(&b, "[%s] %s ", p.id, p.tail())
	}
	return strings.TrimSpace(b.String())
}

func (p *relayProc) tail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, " | ")
}

// sampleRSS updates the peak resident set from /proc/PID/status (VmHWM is the
// kernel's own high-water mark, so sampling now and then misses no peak as long as
// one sample comes before the process exits).
func (p *relayProc) sampleRSS() {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			f := strings.Fields(v)
			if len(f) >= 1 {
				if kb, err := strconv.ParseInt(f[0], 10, 64); err == nil {
					p.mu.Lock()
					p.peakRSS = max(p.peakRSS, kb*1024)
					p.mu.Unlock()
				}
			}
		}
	}
}

func (p *relayProc) peak() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.peakRSS
}

// exited reports an error if the relay died while it should be running.
func (p *relayProc) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("relay %s exited: %v: %s", p.id, p.waitErr, p.tail())
	default:
		return nil
	}
}

// stop sends SIGTERM and waits for a clean exit, reading the peak RSS first.
func (p *relayProc) stop() error {
	p.sampleRSS()
	select {
	case <-p.done:
		return fmt.Errorf("relay %s had exited: %v: %s", p.id, p.waitErr, p.tail())
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(90 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("relay %s did not stop within 90s of SIGTERM", p.id)
	}
	if p.waitErr != nil {
		var ee *exec.ExitError
		if errors.As(p.waitErr, &ee) {
			return fmt.Errorf("relay %s exited with %v: %s", p.id, p.waitErr, p.tail())
		}
	}
	return nil
}

// cpu is the CPU time (user and system) the relay's process used over its
// whole life; zero until it has exited.
func (p *relayProc) cpu() time.Duration {
	select {
	case <-p.done:
	default:
		return 0
	}
	if ps := p.cmd.ProcessState; ps != nil {
		return ps.UserTime() + ps.SystemTime()
	}
	return 0
}

// stopRelays stops every relay and returns the first error.
func stopRelays(ps []*relayProc) error {
	errs := make([]error, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = p.stop() }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func sampleAll(ps []*relayProc) error {
	for _, p := range ps {
		p.sampleRSS()
		if err := p.exited(); err != nil {
			return err
		}
	}
	return nil
}

// sampleOnTick waits for the next tick (or the end of ctx, its error) and then
// samples procs: one step of a loop that watches the relays while it waits.
func sampleOnTick(ctx context.Context, tick <-chan time.Time, procs []*relayProc) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-tick:
	}
	return sampleAll(procs)
}

// RelayRSS is one relay's peak resident memory.
type RelayRSS struct {
	ID           string  `json:"id"`
	PeakRSSBytes int64   `json:"peak_rss_bytes"`
	PeakRSSMiB   float64 `json:"peak_rss_mib"`
}

func rssOf(ps []*relayProc) []RelayRSS {
	out := make([]RelayRSS, len(ps))
	for i, p := range ps {
		out[i] = RelayRSS{ID: p.id, PeakRSSBytes: p.peak(), PeakRSSMiB: round2(float64(p.peak()) / (1 << 20))}
	}
	return out
}

func maxRSSMiB(rs []RelayRSS) float64 {
	var m float64
	for _, r := range rs {
		m = max(m, r.PeakRSSMiB)
	}
	return m
}
