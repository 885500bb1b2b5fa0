package cli

import (
	"testing"
	"time"
)

// A multi-host URL shares --connect-timeout among its hosts, so that a hung
// first host does not take a new connection's whole budget.
func TestConnectTimeoutIsSharedAmongHosts(t *testing.T) {
	for _, c := range []struct {
		url   string
		total time.Duration
		want  time.Duration
	}{
		{"postgres://u@a:5432/db", 10 * time.Second, 10 * time.Second},
		{"postgres://u@a:5432/db?sslmode=prefer", 10 * time.Second, 10 * time.Second}, // one host, two attempts (TLS, then plain)
		{"postgres://u@a:5432,b:5432/db", 10 * time.Second, 5 * time.Second},
		{"postgres://u@a:5432,b:5433,c:5434/db?target_session_attrs=read-write", 12 * time.Second, 4 * time.Second},
		{"host=a,b port=5432 dbname=db", 10 * time.Second, 5 * time.Second},
		{"postgres://u@a,b,c,d,e,f,g,h/db", 10 * time.Second, 2 * time.Second}, // at least 2s a host
		{"postgres://u@a,b/db", time.Second, time.Second},                      // never more than the whole
	} {
		d := dbFlags{url: c.url, schema: "public", connectTimeout: c.total}
		cfg, err := d.parse()
		if err != nil {
			t.Fatalf("%s: %v", c.url, err)
		}
		if cfg.ConnectTimeout != c.want {
			t.Errorf("%s with --connect-timeout %s: %s a host, want %s", c.url, c.total, cfg.ConnectTimeout, c.want)
		}
	}
}
