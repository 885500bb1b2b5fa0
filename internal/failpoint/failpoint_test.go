package failpoint

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestInertByDefault(t *testing.T) {
	t.Cleanup(func() { install(nil) })
	install(nil)
	for _, name := range Points {
		if err := Inject(name); err != nil {
			t.Fatalf("Inject(%s) = %v with nothing enabled", name, err)
		}
	}
}

func TestErrorOnNthHit(t *testing.T) {
	t.Cleanup(func() { install(nil) })
	if err := Parse("relay/claim=2*error; relay/mark=off"); err != nil {
		t.Fatal(err)
	}
	if err := Inject(RelayClaim); err != nil {
		t.Fatalf("first hit: %v, want nil", err)
	}
	if err := Inject(RelayClaim); !errors.Is(err, ErrInjected) {
		t.Fatalf("second hit: %v, want ErrInjected", err)
	}
	if err := Inject(RelayClaim); err != nil {
		t.Fatalf("third hit: %v, want nil", err)
	}
	if err := Inject(RelayMark); err != nil {
		t.Fatalf("off point: %v", err)
	}
	Disable(RelayClaim)
	if err := Enable(RelayMark, "error"); err != nil {
		t.Fatal(err)
	}
	if err := Inject(RelayMark); !errors.Is(err, ErrInjected) {
		t.Fatalf("enabled point: %v", err)
	}
}

func TestDelay(t *testing.T) {
	t.Cleanup(func() { install(nil) })
	if err := Enable(CleanupMidBatch, "delay(20ms)"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := Inject(CleanupMidBatch); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 20*time.Millisecond {
		t.Fatalf("delay(20ms) returned after %s", d)
	}
}

func TestParseErrors(t *testing.T) {
	t.Cleanup(func() { install(nil) })
	for _, spec := range []string{"relay/claim", "relay/claim=explode", "relay/claim=0*crash",
		"relay/claim=x*crash", "relay/claim=delay(soon)", "relay/claim=delay(-1s)"} {
		if err := Parse(spec); err == nil {
			t.Errorf("Parse(%q) accepted", spec)
		}
	}
}

// TestCrashIsSIGKILL runs this test binary as a child with a crash point enabled
// from the environment and checks it died of SIGKILL.
func TestCrashIsSIGKILL(t *testing.T) {
	if os.Getenv("FAILPOINT_CHILD") == "1" {
		if err := EnvError(); err != nil {
			t.Fatal(err)
		}
		_ = Inject(RelayAfterPublish)
		t.Fatal("survived a crash point")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashIsSIGKILL$")
	cmd.Env = append(os.Environ(), "FAILPOINT_CHILD=1", EnvVar+"="+RelayAfterPublish+"=crash")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("child: %v\n%s", err, out)
	}
	ws := ee.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want SIGKILL\n%s", ee, out)
	}
	if !strings.Contains(string(out), "failpoint relay/after-publish: crash") {
		t.Fatalf("child did not say which point crashed it:\n%s", out)
	}
}
