package systool

import (
	"os/exec"
	"strings"
	"testing"
)

// TestFindsInstalledProgram: a program that every machine of this kind has (sh) is
// found without any install, and its path runs.
func TestFindsInstalledProgram(t *testing.T) {
	p := Need(t, Tool{Program: "sh", Package: "dash"})
	out, err := exec.Command(p, "-c", "echo ok").Output()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("%s: %q, %v", p, out, err)
	}
}

// TestMissingPackageIsAnError: a program no package holds is an error that names
// the package and the command to run, never a skip.
func TestMissingPackageIsAnError(t *testing.T) {
	_, err := Ensure(Tool{Program: "pgoutbox-no-such-program", Package: "pgoutbox-no-such-package"})
	if err == nil {
		t.Fatal("a missing program with no package was not an error")
	}
	for _, want := range []string{"pgoutbox-no-such-program", "apt-get install -y pgoutbox-no-such-package"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}
