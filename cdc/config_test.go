package cdc_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/cdc"
)

func TestDefaultSlotNames(t *testing.T) {
	for schema, want := range map[string]string{"public": "pgoutbox_public", "app_1": "pgoutbox_app_1"} {
		if got := cdc.DefaultSlot(schema); got != want {
			t.Errorf("DefaultSlot(%q) = %q, want %q", schema, got, want)
		}
	}
	a, b := cdc.DefaultSlot("App"), cdc.DefaultSlot("app")
	long := cdc.DefaultSlot(strings.Repeat("x", 63))
	if a == b || len(long) > 63 {
		t.Errorf("folded names collide or overflow: %q %q %q", a, b, long)
	}
	for _, s := range []string{"App", "with space", "ünïcode", strings.Repeat("x", 63)} {
		c := cdc.Config{Schema: s}
		if err := c.Validate(); err != nil {
			t.Errorf("schema %q: %v", s, err)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	for _, c := range []cdc.Config{
		{Slot: "Bad-Name"}, {Publication: "x y"}, {BatchSize: -1}, {BatchSize: 100, MaxBuffered: 10},
		{StatusInterval: time.Minute}, {BackoffBase: 2 * time.Second, BackoffMax: time.Second},
		{StandbyPollInterval: -time.Millisecond}, {Workers: -1}, {Workers: cdc.MaxWorkers + 1},
		{FailoverCheckInterval: -time.Second}, {StandbyURL: "postgres://u:hunter2@127.0.0.1:notaport/x"},
	} {
		if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), "cdc: Config.") || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%+v: %v, want a cdc: Config.<field> error not showing the value", c, err)
		}
	}
}

// A nil *Config is all defaults, valid; New copies the caller's Config and
// fills the defaults the field docs name.
func TestConfigDefaults(t *testing.T) {
	var nilCfg *cdc.Config
	if err := nilCfg.Validate(); err != nil {
		t.Fatalf("nil Config: %v", err)
	}
	for _, c := range []cdc.Config{{BatchSize: cdc.MaxBatchSize}, {StatusInterval: cdc.MaxStatusInterval}, {Workers: 1}, {Workers: cdc.MaxWorkers}} {
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
	for _, c := range []cdc.Config{{BatchSize: cdc.MaxBatchSize + 1}, {StatusInterval: cdc.MaxStatusInterval + 1}} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: valid, want an error", c)
		}
	}
	err := (&cdc.Config{BatchSize: -1, RunLength: -1}).Validate()
	if err == nil || !strings.Contains(err.Error(), "Config.BatchSize") || !strings.Contains(err.Error(), "Config.RunLength") {
		t.Errorf("two invalid fields: %v, want both named", err)
	}
}
