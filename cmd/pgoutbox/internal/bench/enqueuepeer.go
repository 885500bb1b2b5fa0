package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/pgoutbox/pgoutbox/internal/redact"
)

// peerName names the cells of the real watermill-sql peer in tables and targets.
const peerName = "watermill-sql forwarder Publish (real)"

// PeerBuildHint says how to build the peer binary of Config.EnqueuePeerBin,
// from the repository's root.
const PeerBuildHint = "go build -o watermillsql ./bench/peers/watermillsql"

// peerNotRun is EnqueueResult.PeerNotRun when no peer binary was given.
const peerNotRun = "the " + peerName + " cells were not run: no --enqueue-peer-bin (env PGOUTBOX_BENCH_ENQUEUE_PEER_BIN); " +
	"build the peer from the repository's root with '" + PeerBuildHint + "' and pass its path"

// maxPeerOutput bounds what the bench reads of a peer's stdout (its two JSON
// lines; the second holds a latency histogram of some 100 KiB).
const maxPeerOutput = 16 << 20

// checkPeerBin reports why path cannot be run as the peer binary, or nil.
func checkPeerBin(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("enqueue peer binary (--enqueue-peer-bin): %w; build it with '%s'", err, PeerBuildHint)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("enqueue peer binary (--enqueue-peer-bin) %s is not an executable file; build it with '%s'", path, PeerBuildHint)
	}
	return nil
}

// peerResult is the peer's second line (bench/peers/watermillsql).
type peerResult struct {
	Commits int64                  `json:"commits"`
	Seconds float64                `json:"seconds"`
	CPUNs   float64                `json:"cpu_ns"`
	LastID  int64                  `json:"last_id"`
	Latency *hdrhistogram.Snapshot `json:"latency"`
}

// peerSlice runs one round of the peer cell sp for d in the peer process and
// adds what it measured to cell and hist, as slice does for the bench's own
// cells: the peer warms its connections and says their backends, the bench
// reads their CPU, lets the peer run, reads it again and adds the peer
// process's own CPU over the timed part.
func (e *enqueueBench) peerSlice(ctx context.Context, sp enqueueSpec, d time.Duration, cell *EnqueueCell, hist *hdrhistogram.Histogram, round string) (err error) {
	label := sp.label()
	e.r.prog.step("enqueue%s: %s", round, label)
	doc, err := json.Marshal(e.payload)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, e.r.cfg.EnqueuePeerBin, "-schema", e.s.name, "-producers", strconv.Itoa(sp.producers),
		"-duration", d.String(), "-first-id", strconv.FormatInt(e.next.Load()+1, 10), "-business-sql", e.insert, "-payload", string(doc))
	cmd.Env = append(relayEnv(), "DATABASE_URL="+e.r.cfg.DatabaseURL) // not in argv: ps shows argv
	stderr := &tailBuffer{max: 4 << 10}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: start %s: %w", label, e.r.cfg.EnqueuePeerBin, err)
	}
	waited := false
	defer func() {
		_ = stdin.Close()
		if !waited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if err != nil {
			err = fmt.Errorf("%s: %w; the peer said: %s", label, err, redact.Text(strings.TrimSpace(stderr.String()), e.r.secrets...))
		}
	}()
	rd := bufio.NewReader(io.LimitReader(stdout, maxPeerOutput))
	var ready struct {
		BackendPids []int `json:"backend_pids"`
	}
	if err := readJSONLine(rd, &ready); err != nil {
		return fmt.Errorf("the peer's first line: %w", err)
	}
	if len(ready.BackendPids) != sp.producers {
		return fmt.Errorf("the peer has %d backends, want %d", len(ready.BackendPids), sp.producers)
	}
	server0, _, cpuOK := cpuNs(ready.BackendPids)
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		return fmt.Errorf("start the peer's round: %w", err)
	}
	var res peerResult
	if err := readJSONLine(rd, &res); err != nil {
		return fmt.Errorf("the peer's result: %w", err)
	}
	// The peer keeps its connections until its stdin closes, so their backends
	// are still there to be read.
	server1, _, ok := cpuNs(ready.BackendPids)
	_ = stdin.Close()
	waited = true
	if err := cmd.Wait(); err != nil {
		return err
	}
	if res.Commits < 0 || res.Seconds <= 0 || res.CPUNs < 0 || res.Latency == nil {
		return fmt.Errorf("the peer's result is out of range: %d commits in %gs, %g ns CPU", res.Commits, res.Seconds, res.CPUNs)
	}
	if res.LastID > e.next.Load() {
		e.next.Store(res.LastID)
	}
	hist.Merge(hdrhistogram.Import(res.Latency))
	if n := res.Commits; cpuOK && ok && n > 0 {
		cell.serverSum += server1 - server0
		cell.cpuSum += server1 - server0 + res.CPUNs
		cell.RoundCPUUsPerCommit = append(cell.RoundCPUUsPerCommit, round2((server1-server0+res.CPUNs)/1000/float64(n)))
	}
	cell.Commits += res.Commits
	cell.Seconds += res.Seconds
	cell.RoundCommitsPerSec = append(cell.RoundCommitsPerSec, round2(float64(res.Commits)/res.Seconds))
	return nil
}

// readJSONLine decodes the next line of rd into v.
func readJSONLine(rd *bufio.Reader, v any) error {
	line, err := rd.ReadBytes('\n')
	if err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("the peer ended its output")
		}
		return err
	}
	return json.Unmarshal(line, v)
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
