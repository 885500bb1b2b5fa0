package deploy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/pgoutbox/pgoutbox/cmd/pgoutbox/cli"
	"github.com/pgoutbox/pgoutbox/health"
)

const (
	systemdUnit = "systemd/pgoutbox-relay.service"
	k8sManifest = "kubernetes/relay.yaml"
)

// stopMargin is how much longer than --shutdown-timeout the service manager
// must wait before SIGKILL: after the relay stopped, the in-relay cleaner gets
// up to 10s to stop (cmd/pgoutbox/cli/relay.go) and the leases are released.
const stopMargin = 10 * time.Second

// relayHelp is what `pgoutbox relay --help` says, from the real CLI in process.
type relayHelp struct {
	flags           map[string]string // flag name → value type; "" for a boolean
	envs            map[string]bool   // the (env NAME) variables
	shutdownDefault time.Duration     // --shutdown-timeout's default
}

var (
	helpOnce sync.Once
	help     relayHelp
	helpErr  string
)

func readRelayHelp(t *testing.T) relayHelp {
	t.Helper()
	helpOnce.Do(func() {
		var out, errOut bytes.Buffer
		if code := cli.Run(context.Background(), []string{"relay", "--help"}, &out, &errOut); code != 0 {
			helpErr = "pgoutbox relay --help: exit status " + strconv.Itoa(code) + ": " + errOut.String()
			return
		}
		text := out.String()
		help = relayHelp{flags: map[string]string{}, envs: map[string]bool{}}
		flagRE := regexp.MustCompile(`^\s+(?:-[a-zA-Z], )?--([a-z0-9-]+)(?: ([a-zA-Z0-9]+))?\s{2,}(.*)$`)
		sc := bufio.NewScanner(strings.NewReader(text))
		for sc.Scan() {
			m := flagRE.FindStringSubmatch(sc.Text())
			if m == nil {
				continue
			}
			help.flags[m[1]] = m[2]
			if m[1] == "shutdown-timeout" {
				d := regexp.MustCompile(`\(default ([^)]+)\)`).FindStringSubmatch(m[3])
				if d == nil {
					helpErr = "no default in --shutdown-timeout's help: " + m[3]
					return
				}
				v, err := time.ParseDuration(d[1])
				if err != nil {
					helpErr = "--shutdown-timeout's default: " + err.Error()
					return
				}
				help.shutdownDefault = v
			}
		}
		for _, m := range regexp.MustCompile(`\(env ([A-Z0-9_]+)\)`).FindAllStringSubmatch(text, -1) {
			help.envs[m[1]] = true
		}
		if len(help.flags) < 10 || help.shutdownDefault == 0 || !help.envs["DATABASE_URL"] {
			helpErr = "could not read the flags from pgoutbox relay --help:\n" + text
		}
	})
	if helpErr != "" {
		t.Fatal(helpErr)
	}
	return help
}

// relayArgs checks args (what follows `pgoutbox`) against the relay's help and
// returns the flags' values. Secrets must not be among them.
func relayArgs(t *testing.T, where string, args []string) map[string]string {
	t.Helper()
	h := readRelayHelp(t)
	if len(args) == 0 || args[0] != "relay" {
		t.Fatalf("%s: arguments %q do not start with the relay verb", where, args)
	}
	values := map[string]string{}
	for i := 1; i < len(args); i++ {
		a := args[i]
		name, value, hasValue := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") {
			t.Errorf("%s: argument %q is not a --flag", where, a)
			continue
		}
		typ, ok := h.flags[name]
		if !ok {
			t.Errorf("%s: --%s is not a flag of pgoutbox relay", where, name)
			continue
		}
		if !hasValue && typ != "" {
			if i+1 >= len(args) {
				t.Errorf("%s: --%s needs a value", where, name)
				continue
			}
			i++
			value = args[i]
		}
		values[name] = value
	}
	for _, secret := range []string{"database-url", "broker"} {
		if _, set := values[secret]; set {
			t.Errorf("%s: --%s on the command line shows its secrets in ps and the logs; use the environment", where, secret)
		}
	}
	for _, a := range args {
		if strings.Contains(a, "://") || strings.Contains(a, "@") {
			t.Errorf("%s: argument %q looks like a connection string with credentials", where, a)
		}
	}
	return values
}

// shutdownTimeout is --shutdown-timeout as the arguments set it, else its default.
func shutdownTimeout(t *testing.T, where string, values map[string]string) time.Duration {
	t.Helper()
	v, ok := values["shutdown-timeout"]
	if !ok {
		return readRelayHelp(t).shutdownDefault
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s: --shutdown-timeout %q: want a positive duration", where, v)
	}
	return d
}

// metricsPort is the port of --metrics-addr; the health endpoints need it.
func metricsPort(t *testing.T, where string, values map[string]string) int {
	t.Helper()
	addr := values["metrics-addr"]
	if addr == "" {
		t.Fatalf("%s: no --metrics-addr: no /metrics, /healthz or /readyz", where)
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%s: --metrics-addr %q: %v", where, addr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p <= 0 {
		t.Fatalf("%s: --metrics-addr %q: want a fixed port", where, addr)
	}
	return p
}

// checkHealthPath fails t unless the health server answers path with 200 (an
// unknown path answers 404, so a typo fails).
func checkHealthPath(t *testing.T, where, path string) {
	t.Helper()
	h, err := health.Handler(nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	if rec.Code != http.StatusOK {
		t.Errorf("%s: GET %s on the relay's health server: %d, want 200", where, path, rec.Code)
	}
}

// TestHealthPathCheckCanFail: a path the health server does not serve is not
// 200, so checkHealthPath catches a wrong probe path.
func TestHealthPathCheckCanFail(t *testing.T) {
	t.Parallel()
	h, err := health.Handler(nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/health", nil))
	if rec.Code == http.StatusOK {
		t.Fatalf("GET /health answered 200: the probe path check cannot tell a wrong path")
	}
}

// systemdUnitFile is a parsed unit: section → key → values in order.
type systemdUnitFile map[string]map[string][]string

func readSystemdUnit(t *testing.T, path string) systemdUnitFile {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	u := systemdUnitFile{}
	section := ""
	var pending string
	for n, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if pending != "" {
			line, pending = pending+" "+line, ""
		}
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if l, ok := strings.CutSuffix(line, `\`); ok {
			pending = l
			continue
		}
		if line[0] == '[' && line[len(line)-1] == ']' {
			section = line[1 : len(line)-1]
			u[section] = map[string][]string{}
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || section == "" {
			t.Fatalf("%s:%d: not a key=value line in a section: %q", path, n+1, line)
		}
		u[section][strings.TrimSpace(k)] = append(u[section][strings.TrimSpace(k)], strings.TrimSpace(v))
	}
	return u
}

func (u systemdUnitFile) one(t *testing.T, section, key string) string {
	t.Helper()
	vs := u[section][key]
	if len(vs) != 1 {
		t.Fatalf("%s: [%s] %s set %d times, want once", systemdUnit, section, key, len(vs))
	}
	return vs[0]
}

// systemdSeconds parses a systemd time span of the forms the unit uses: "45",
// "45s", "1min 30s", "2m".
func systemdSeconds(t *testing.T, v string) time.Duration {
	t.Helper()
	if n, err := strconv.Atoi(v); err == nil {
		return time.Duration(n) * time.Second
	}
	s := strings.ReplaceAll(strings.ReplaceAll(v, "min", "m"), " ", "")
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("%s: time span %q: %v", systemdUnit, v, err)
	}
	return d
}

func TestSystemdUnit(t *testing.T) {
	t.Parallel()
	u := readSystemdUnit(t, systemdUnit)
	exec := strings.TrimLeft(u.one(t, "Service", "ExecStart"), "-@:+!")
	fields := strings.Fields(exec)
	if len(fields) < 2 || !strings.HasSuffix(fields[0], "/pgoutbox") {
		t.Fatalf("ExecStart %q does not run pgoutbox", exec)
	}
	values := relayArgs(t, systemdUnit+" ExecStart", fields[1:])
	metricsPort(t, systemdUnit, values)
	stop := systemdSeconds(t, u.one(t, "Service", "TimeoutStopSec"))
	if drain := shutdownTimeout(t, systemdUnit, values); stop < drain+stopMargin {
		t.Errorf("TimeoutStopSec %s: want at least --shutdown-timeout %s + %s", stop, drain, stopMargin)
	}
	if got := u.one(t, "Service", "Restart"); got != "on-failure" {
		t.Errorf("Restart=%s, want on-failure", got)
	}
	if len(u["Service"]["EnvironmentFile"]) == 0 && len(u["Service"]["LoadCredential"]) == 0 {
		t.Error("secrets need EnvironmentFile= or LoadCredential=")
	}
	if vs := u["Service"]["Environment"]; len(vs) > 0 {
		t.Errorf("Environment=%q: secrets belong in EnvironmentFile= (Environment= is world-readable via systemctl show)", vs)
	}
	for k, want := range map[string]string{
		"DynamicUser": "yes", "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
		"PrivateTmp": "yes", "PrivateDevices": "yes", "KillSignal": "SIGTERM",
	} {
		if got := u.one(t, "Service", k); got != want {
			t.Errorf("%s=%s, want %s", k, got, want)
		}
	}
	if got := u.one(t, "Service", "CapabilityBoundingSet"); got != "" {
		t.Errorf("CapabilityBoundingSet=%s, want empty (no capabilities)", got)
	}
	if got := u.one(t, "Install", "WantedBy"); got != "multi-user.target" {
		t.Errorf("WantedBy=%s", got)
	}
}

type k8sObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
}

type k8sDeployment struct {
	Spec struct {
		Replicas *int `yaml:"replicas"`
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec struct {
				TerminationGracePeriodSeconds *int `yaml:"terminationGracePeriodSeconds"`
				SecurityContext               struct {
					RunAsNonRoot *bool `yaml:"runAsNonRoot"`
					RunAsUser    *int  `yaml:"runAsUser"`
				} `yaml:"securityContext"`
				Containers []k8sContainer `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type k8sContainer struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Env     []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef"`
			FieldRef *struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		RunAsNonRoot             *bool `yaml:"runAsNonRoot"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"` // a number or a port name
	} `yaml:"httpGet"`
}

type k8sService struct {
	Spec struct {
		Selector map[string]string `yaml:"selector"`
		Ports    []struct {
			Name       string `yaml:"name"`
			Port       int    `yaml:"port"`
			TargetPort any    `yaml:"targetPort"`
		} `yaml:"ports"`
	} `yaml:"spec"`
}

func readK8s(t *testing.T) map[string]*yaml.Node {
	t.Helper()
	b, err := os.ReadFile(k8sManifest)
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]*yaml.Node{}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var n yaml.Node
		if err := dec.Decode(&n); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("%s: %v", k8sManifest, err)
		}
		var o k8sObject
		if err := n.Decode(&o); err != nil {
			t.Fatalf("%s: %v", k8sManifest, err)
		}
		if docs[o.Kind] != nil {
			t.Fatalf("%s: two %s objects", k8sManifest, o.Kind)
		}
		docs[o.Kind] = &n
	}
	return docs
}

func isTrue(b *bool) bool { return b != nil && *b }

func TestKubernetesManifest(t *testing.T) {
	t.Parallel()
	docs := readK8s(t)
	if docs["Deployment"] == nil {
		t.Fatalf("%s has no Deployment", k8sManifest)
	}
	var d k8sDeployment
	if err := docs["Deployment"].Decode(&d); err != nil {
		t.Fatal(err)
	}
	pod := d.Spec.Template.Spec
	for k, v := range d.Spec.Selector.MatchLabels {
		if d.Spec.Template.Metadata.Labels[k] != v {
			t.Errorf("selector %s=%s does not match the pod template's labels", k, v)
		}
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want the relay alone", len(pod.Containers))
	}
	c := pod.Containers[0]
	where := k8sManifest + " container " + c.Name
	if len(c.Command) > 0 {
		t.Errorf("%s: command %q: the image's entrypoint is pgoutbox; set args only", where, c.Command)
	}
	values := relayArgs(t, where+" args", c.Args)
	port := metricsPort(t, where, values)
	// The CDC source serves /metrics and a /healthz that reports its health,
	// and no /readyz (cmd/pgoutbox/cli/relay_cdc.go): these probes are the
	// polling relay's.
	if v, set := values["source"]; set && v != "poll" {
		t.Errorf("%s: --source %s: the manifest is for the polling relay (its probes are package health's)", where, v)
	}

	if pod.TerminationGracePeriodSeconds == nil {
		t.Errorf("no terminationGracePeriodSeconds")
	} else {
		grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
		if drain := shutdownTimeout(t, where, values); grace < drain+stopMargin {
			t.Errorf("terminationGracePeriodSeconds %s: want at least --shutdown-timeout %s + %s", grace, drain, stopMargin)
		}
	}

	portName := ""
	for _, p := range c.Ports {
		if p.ContainerPort == port {
			portName = p.Name
		}
	}
	if portName == "" {
		t.Errorf("%s: no containerPort %d (--metrics-addr)", where, port)
	}
	probe := func(kind string, p *k8sProbe, path string) {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s: no %s httpGet probe", where, kind)
			return
		}
		if p.HTTPGet.Path != path {
			t.Errorf("%s: %s path %q, want %q", where, kind, p.HTTPGet.Path, path)
		}
		checkHealthPath(t, where+" "+kind, p.HTTPGet.Path)
		switch v := p.HTTPGet.Port.(type) {
		case int:
			if v != port {
				t.Errorf("%s: %s port %d, want --metrics-addr's %d", where, kind, v, port)
			}
		case string:
			if v != portName || portName == "" {
				t.Errorf("%s: %s port %q, want the name of containerPort %d", where, kind, v, port)
			}
		default:
			t.Errorf("%s: %s port %v", where, kind, v)
		}
	}
	probe("livenessProbe", c.LivenessProbe, "/healthz")
	probe("readinessProbe", c.ReadinessProbe, "/readyz")

	h := readRelayHelp(t)
	fromSecret := map[string]bool{}
	for _, e := range c.Env {
		if !h.envs[e.Name] {
			t.Errorf("%s: env %s is not a variable of pgoutbox relay --help", where, e.Name)
		}
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			fromSecret[e.Name] = true
		}
	}
	for _, e := range c.Env {
		if e.Name == "PGOUTBOX_SOURCE" && e.Value != "poll" {
			t.Errorf("%s: PGOUTBOX_SOURCE=%q: the manifest's probes are the polling relay's", where, e.Value)
		}
	}
	for _, secret := range []string{"DATABASE_URL", "PGOUTBOX_BROKER"} {
		if !fromSecret[secret] {
			t.Errorf("%s: %s must come from a Secret (secretKeyRef)", where, secret)
		}
	}
	if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
		t.Errorf("%s: resources %+v: want cpu and memory requests and a memory limit", where, c.Resources)
	}
	sc := c.SecurityContext
	if !isTrue(sc.ReadOnlyRootFilesystem) || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		!(isTrue(sc.RunAsNonRoot) || isTrue(pod.SecurityContext.RunAsNonRoot)) || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("%s: securityContext %+v: want non-root, a read-only root file system, no privilege escalation, all capabilities dropped", where, sc)
	}

	if docs["Service"] == nil {
		t.Fatalf("%s has no Service for the metrics", k8sManifest)
	}
	var s k8sService
	if err := docs["Service"].Decode(&s); err != nil {
		t.Fatal(err)
	}
	for k, v := range s.Spec.Selector {
		if d.Spec.Template.Metadata.Labels[k] != v {
			t.Errorf("Service selector %s=%s does not match the pods", k, v)
		}
	}
	if len(s.Spec.Ports) != 1 || (s.Spec.Ports[0].TargetPort != portName && s.Spec.Ports[0].TargetPort != port) {
		t.Errorf("Service ports %+v: want one targeting the metrics port", s.Spec.Ports)
	}
}

// TestSystemdAnalyze has systemd itself read the unit: `systemd-analyze verify`
// reports unknown keys and values it cannot parse (it only warns, so any output
// fails), and `systemd-analyze security --offline` scores the hardening.
func TestSystemdAnalyze(t *testing.T) {
	t.Parallel()
	bin, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed (Debian's systemd package)")
	}
	u, err := os.ReadFile(systemdUnit)
	if err != nil {
		t.Fatal(err)
	}
	// verify wants ExecStart's program to exist: any executable will do.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(u), "ExecStart=/usr/local/bin/pgoutbox ", "ExecStart="+self+" ", 1)
	if text == string(u) {
		t.Fatal("ExecStart does not run /usr/local/bin/pgoutbox")
	}
	path := filepath.Join(t.TempDir(), filepath.Base(systemdUnit))
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "verify", path).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	out, err = exec.CommandContext(ctx, bin, "security", "--offline=yes", path).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no exposure level in systemd-analyze security's output:\n%s", out)
	}
	level, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	const maxExposure = 2.0 // systemd's scale: 0 (locked down) to 10 (exposed)
	if level > maxExposure {
		t.Errorf("systemd-analyze security: exposure %.1f, want at most %.1f:\n%s", level, maxExposure, out)
	}
	t.Logf("systemd-analyze security: exposure %.1f", level)
}
