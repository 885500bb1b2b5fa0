package cli

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// relay --source cdc --metrics-addr serves cdcprom's metrics beside the
// source's collector (one registry: their names must not collide) and /healthz.
func TestCDCRelayServesMetrics(t *testing.T) {
	t.Parallel()
	e := newCDCRelayEnv(t)
	e.dropCDC()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	pgtest.Must(t, err, "pick a port for --metrics-addr")
	addr := ln.Addr().String()
	pgtest.Must(t, ln.Close(), "free the port")
	p := e.startCDCRelay(nil, "--metrics-addr", addr)
	e.enqueue(5, 2)
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return 0, err.Error()
		}
		return resp.StatusCode, string(body)
	}
	var body string
	wait.Forf(t, 60*time.Second, func() string { return "cdcprom's and the collector's metrics on /metrics:\n" + body }, func() bool {
		var code int
		code, body = get("/metrics")
		return code == 200 && strings.Contains(body, "pgoutbox_cdc_published_total 10") &&
			strings.Contains(body, "pgoutbox_cdc_events_published_total{") && strings.Contains(body, "pgoutbox_cdc_confirmed_lsn")
	})
	if code, body := get("/healthz"); code != 200 {
		t.Errorf("/healthz: %d %s", code, body)
	}
	p.stopClean(t, "relay")
}
