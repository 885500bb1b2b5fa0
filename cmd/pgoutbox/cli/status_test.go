package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestStatusVerb(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t)
	evs := e.enqueue(1, "s1", "s2", "s3", "s4")
	e.quarantine(evs["s1"][0], "boom")
	e.exec("UPDATE "+e.table("outbox_events")+" SET claimed_by = 'cli-relay', claim_until = now() + interval '1 hour' WHERE event_id = $1", evs["s2"][0])
	e.exec("UPDATE "+e.table("outbox_events")+" SET occurred_at = now() - interval '200 seconds' WHERE event_id = $1", evs["s3"][0])
	e.exec("UPDATE "+e.table("outbox_events")+" SET published_at = now() WHERE event_id = $1", evs["s4"][0])

	out, errOut, code := run(t, e.args("status", "--json")...)
	if code != 0 {
		t.Fatalf("status --json: code %d, stderr %q", code, errOut)
	}
	var st admin.Status
	pgtest.Must(t, json.Unmarshal([]byte(out), &st), "parse --json output %q", out)
	age := time.Duration(st.OldestPendingAge)
	if st.Schema != e.schema || st.Pending != 2 || st.Quarantined != 1 || st.BackingOff != 0 || st.PublishedLastMinute != 1 ||
		len(st.Leases) != 1 || st.Leases[0] != (admin.Lease{RelayID: "cli-relay", Live: 1}) ||
		age < 200*time.Second || age > 260*time.Second || len(st.Tables) != 3 || st.Dedup == nil || st.Dedup.TotalBytes <= 0 {
		t.Fatalf("status --json: %+v\n%s", st, out)
	}

	out, errOut, code = run(t, e.args("status")...)
	if code != 0 {
		t.Fatalf("status: code %d, stderr %q", code, errOut)
	}
	for _, re := range []string{
		`(?m)^pending +2$`, `(?m)^oldest pending age +3m2\ds$`, `(?m)^quarantined +1 +\(pgoutbox dlq list\)$`,
		`(?m)^published last minute +1$`, `(?m)^cli-relay +1 +0$`,
		`(?m)^outbox_events +\d+(\.\d)? KiB +\d+(\.\d)? KiB +\d+(\.\d)? KiB$`,
		`(?m)^` + e.schema + `\.processed_events \(dedup\) +\d+(\.\d)? KiB`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("human output does not match %s:\n%s", re, out)
		}
	}

	// An inbox elsewhere: its dedup table is absent here, which is not an error.
	out, _, code = run(t, e.args("status", "--inbox-schema", e.schema+"_elsewhere")...)
	if code != 0 || !regexp.MustCompile(`(?m)^`+e.schema+`_elsewhere\.processed_events \(dedup\) +absent`).MatchString(out) {
		t.Fatalf("status --inbox-schema: code %d:\n%s", code, out)
	}
	out, _, _ = run(t, e.args("status", "--json", "--inbox-schema", e.schema+"_elsewhere")...)
	if !strings.Contains(out, `"dedup_table": null`) {
		t.Fatalf("absent dedup table in JSON:\n%s", out)
	}
}

func TestStatusErrors(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t, 2) // created, not migrated
	_ = pool
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"status", "--interval", "0s"}, 2, "--interval must be positive"},
		{[]string{"status", "--inbox-schema", strings.Repeat("x", 64)}, 2, "--inbox-schema"},
		{[]string{"status", "extra"}, 2, "takes no arguments"},
		{[]string{"status", "--database-url", pgtest.URL(), "--schema", schema}, 1, "pgoutbox migrate"},
	} {
		_, errOut, code := run(t, c.args...)
		if code != c.code || !strings.Contains(errOut, c.msg) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: code %d, stderr %q; want code %d and %q on one line", c.args, code, errOut, c.code, c.msg)
		}
	}
}

// --watch with stdout a pipe prints successive JSON snapshots separated by a blank
// line, without terminal escapes; SIGINT (Ctrl-C) ends it with status 0.
func TestStatusWatchPipeStopsOnInterrupt(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t)
	e.enqueue(1, "w1")
	cmd := exec.Command(binary, e.args("status", "--watch", "--json", "--interval", "50ms")...)
	stdout, err := cmd.StdoutPipe()
	pgtest.Must(t, err, "pipe")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	pgtest.Must(t, cmd.Start(), "start")
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})

	var mu sync.Mutex
	var all bytes.Buffer
	snapshots := make(chan admin.Status, 100)
	go func() {
		tee := io.TeeReader(stdout, writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return all.Write(p) }))
		dec := json.NewDecoder(bufio.NewReader(tee))
		for {
			var st admin.Status
			if err := dec.Decode(&st); err != nil {
				close(snapshots)
				return
			}
			snapshots <- st
		}
	}()
	for i := range 3 {
		select {
		case st, ok := <-snapshots:
			if !ok || st.Pending != 1 {
				t.Fatalf("snapshot %d: %+v (ok %v), stderr %q", i, st, ok, stderr.String())
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("no snapshot %d within 30s; stderr %q", i, stderr.String())
		}
	}
	pgtest.Must(t, cmd.Process.Signal(syscall.SIGINT), "interrupt")
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("status --watch after SIGINT: %v, stderr %q", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("status --watch did not stop on SIGINT")
	}
	mu.Lock()
	defer mu.Unlock()
	if out := all.String(); !strings.Contains(out, "}\n\n{") || strings.Contains(out, "\x1b") {
		t.Fatalf("snapshots not separated by a blank line, or terminal escapes in a pipe:\n%.500q", out)
	}
}

// On a terminal each snapshot clears the screen and redraws from the top.
func TestStatusWatchTerminalRedraws(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t)
	a, err := admin.New(e.pool, &admin.Config{Schema: e.schema})
	pgtest.Must(t, err, "admin")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var out bytes.Buffer
	w := writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		if strings.Count(out.String(), statusClearScreen) >= 2 {
			cancel()
		}
		return out.Write(p)
	})
	done := make(chan error, 1)
	go func() { done <- watchStatus(ctx, w, io.Discard, a, 20*time.Millisecond, false, true) }()
	select {
	case err := <-done:
		pgtest.Must(t, err, "watch")
	case <-time.After(30 * time.Second):
		t.Fatal("watch did not stop when its context ended")
	}
	mu.Lock()
	defer mu.Unlock()
	got := out.String()
	if !strings.HasPrefix(got, statusClearScreen) || strings.Count(got, statusClearScreen) < 3 ||
		strings.Count(got, statusClearScreen) != strings.Count(got, "\npending ") {
		t.Fatalf("terminal output:\n%q", got)
	}
}

func TestStatusUnits(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0: "0s", 850 * time.Millisecond: "850ms", 12340 * time.Millisecond: "12.3s", 192 * time.Second: "3m12s",
		2*time.Hour + 5*time.Minute + 10*time.Second: "2h5m", 76 * time.Hour: "3d4h",
	} {
		if got := statusAge(d); got != want {
			t.Errorf("statusAge(%s) = %q, want %q", d, got, want)
		}
	}
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 12 << 20: "12 MiB", 3 << 30: "3.0 GiB"} {
		if got := statusSize(n); got != want {
			t.Errorf("statusSize(%d) = %q, want %q", n, got, want)
		}
	}
}

// status tells "no relay running" from relays idle, and names a relay that
// went silent without stopping as gone.
func TestStatusRelays(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 2)
	db := []string{"--database-url", pgtest.URL(), "--schema", schema}
	out, errOut, code := run(t, append([]string{"status"}, db...)...)
	if code != 0 || !strings.Contains(out, "no relay running") {
		t.Fatalf("no relay ever: code %d, stderr %q:\n%s", code, errOut, out)
	}
	relays := pgx.Identifier{schema, "outbox_relays"}.Sanitize()
	_, err := pool.Exec(context.Background(), "INSERT INTO "+relays+
		" (relay_id, source, version, host, pid, state, beat_every, started_at, last_seen) VALUES ('r-idle', 'poll', 'v1', 'h1', 1, 'idle', '15s', now(), now())")
	pgtest.Must(t, err, "heartbeat")
	out, _, code = run(t, append([]string{"status"}, db...)...)
	if code != 0 || strings.Contains(out, "no relay running") || !regexp.MustCompile(`r-idle +idle `).MatchString(out) {
		t.Fatalf("an idle relay: code %d:\n%s", code, out)
	}
	_, err = pool.Exec(context.Background(), "UPDATE "+relays+" SET last_seen = now() - interval '1 minute'")
	pgtest.Must(t, err, "age")
	out, _, _ = run(t, append([]string{"status"}, db...)...)
	if !strings.Contains(out, "no relay running") || !strings.Contains(out, "gone (idle when last seen)") {
		t.Fatalf("a silent relay:\n%s", out)
	}
	out, _, _ = run(t, append([]string{"status", "--json"}, db...)...)
	if !strings.Contains(out, `"relays": [`) || !strings.Contains(out, `"gone": true`) {
		t.Fatalf("status --json:\n%s", out)
	}
}
