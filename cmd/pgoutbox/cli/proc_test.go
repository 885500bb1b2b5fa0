package cli

// The `pgoutbox` processes a test runs (startProc) and the buffers that hold
// their output.

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"os/exec"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// relayProc is a running `pgoutbox relay` process.
type relayProc struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	stdout *syncBuffer
	done   chan error
}

// startRelayProc runs the binary with args and extra environment, and waits
// until it logged "relay starting"; it is killed when the test ends.
func startRelayProc(t *testing.T, what string, env, args []string) *relayProc {
	t.Helper()
	p, _ := startProc(t, what, env, args, relayStarting)
	return p
}

var relayStarting = regexp.MustCompile(`relay starting`)

// startProc runs the binary with args and extra environment, and waits until
// a line of its stderr matches ready, whose submatches it returns; it is
// killed when the test ends.
func startProc(t *testing.T, what string, env, args []string, ready *regexp.Regexp) (*relayProc, []string) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	p := &relayProc{cmd: cmd, stderr: &syncBuffer{}, stdout: &syncBuffer{}, done: make(chan error, 1)}
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	cmd.Stdout = p.stdout
	pgtest.Must(t, cmd.Start(), "start %s", what)
	matched := make(chan []string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			p.stderr.WriteLine(sc.Text())
			if m := ready.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case matched <- m:
				default: // the first match only
				}
			}
		}
	}()
	go func() { err := cmd.Wait(); pw.Close(); p.done <- err }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	select {
	case m := <-matched:
		return p, m
	case err := <-p.done:
		t.Fatalf("%s exited before starting: %v\n%s", what, err, p.stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not start:\n%s", what, p.stderr.String())
	}
	return nil, nil
}

// stop sends sig and returns the exit code.
func (p *relayProc) stop(t *testing.T, sig syscall.Signal) int {
	t.Helper()
	pgtest.Must(t, p.cmd.Process.Signal(sig), "signal")
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("relay did not exit after %v:\n%s", sig, p.stderr.String())
	}
	return p.cmd.ProcessState.ExitCode()
}

// kill SIGKILLs the process, as a crash would, and waits until it is gone.
func (p *relayProc) kill(t *testing.T) {
	t.Helper()
	pgtest.Must(t, p.cmd.Process.Kill(), "SIGKILL")
	<-p.done
}

// stopClean sends SIGTERM and fails the test, showing the process's log,
// unless it exits 0: a graceful stop.
func (p *relayProc) stopClean(t *testing.T, what string) {
	t.Helper()
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("%s exited %d after SIGTERM:\n%s", what, code, p.stderr.String())
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) WriteLine(l string) { s.mu.Lock(); s.b.WriteString(l + "\n"); s.mu.Unlock() }
func (s *syncBuffer) String() string     { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// Write stores b as one line: an io.Writer for a process's output, which the
// processes under test write a log line per call.
func (s *syncBuffer) Write(b []byte) (int, error) { s.WriteLine(string(b)); return len(b), nil }

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }
