package systool

import (
	"os"
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

// TestNPMPackageInstallsOnce: a library package installs into its own folder,
// Node can load it from there, and a second call finds it without npm.
func TestNPMPackageInstallsOnce(t *testing.T) {
	t.Setenv(NPMDirEnv, t.TempDir())
	p := NPM{Package: "standardwebhooks", Version: "1.0.0"}
	i := NeedNPM(t, p)
	cmd := exec.Command("node", "-e", `require("standardwebhooks"); console.log("ok")`)
	cmd.Env = append(os.Environ(), "NODE_PATH="+i.NodeModules())
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("node could not load the installed package: %q, %v", out, err)
	}
	again, err := EnsureNPM(p)
	if err != nil || again != i {
		t.Fatalf("second call: %+v, %v; want %+v", again, err, i)
	}
}

// TestNPMRefusesHostileNames: a name or version that is not plain never reaches
// npm's command line.
func TestNPMRefusesHostileNames(t *testing.T) {
	t.Setenv(NPMDirEnv, t.TempDir())
	for _, p := range []NPM{
		{Package: "--global", Version: "1.0.0"},
		{Package: "left-pad", Version: "latest"},
		{Package: "../x", Version: "1.0.0"},
		{Package: "left-pad", Version: "1.0.0 --global"},
		{Package: "git+https://example.com/x", Version: "1.0.0"},
	} {
		if _, err := EnsureNPM(p); err == nil {
			t.Errorf("%+v was accepted", p)
		}
	}
}
