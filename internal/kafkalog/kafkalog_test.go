package kafkalog_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgoutbox/pgoutbox/internal/kafkalog"
)

// TestLevels: franz-go's info lines are slog debug lines, asked for only when
// the handler wants debug; warnings and errors keep their level and prefix.
func TestLevels(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	warn := kafkalog.New(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if warn.Level() != kgo.LogLevelWarn {
		t.Errorf("a warn handler asks for %v", warn.Level())
	}
	warn.Log(kgo.LogLevelInfo, "connected", "broker", "1")
	warn.Log(kgo.LogLevelError, "fetch failed", "err", "boom")
	if out := buf.String(); strings.Contains(out, "connected") || !strings.Contains(out, `level=ERROR msg="kafka: fetch failed" err=boom`) {
		t.Errorf("warn handler wrote %q", out)
	}
	buf.Reset()
	debug := kafkalog.New(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if debug.Level() != kgo.LogLevelInfo {
		t.Errorf("a debug handler asks for %v", debug.Level())
	}
	debug.Log(kgo.LogLevelInfo, "connected", "broker", "1")
	if out := buf.String(); !strings.Contains(out, `level=DEBUG msg="kafka: connected" broker=1`) {
		t.Errorf("debug handler wrote %q", out)
	}
}
