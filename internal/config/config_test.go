package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

type sample struct {
	Name    string
	Workers int
	Wait    time.Duration
}

func fill(c *sample) {
	Default(&c.Workers, 4)
	Default(&c.Wait, time.Second)
}

var errBadName = errors.New("bad name")

func check(c *sample, p *Problems) {
	p.Check(c.Workers <= 8, "Config.Workers (%d) must be at most 8", c.Workers)
	p.Check(c.Wait >= time.Millisecond, "Config.Wait (%s) must be at least 1ms", c.Wait)
	if strings.ContainsRune(c.Name, ';') {
		p.Field("Config.Name", errBadName)
	}
}

func TestResolve(t *testing.T) {
	got, err := Resolve("sample", (*sample)(nil), fill, check)
	if err != nil || got != (sample{Workers: 4, Wait: time.Second}) {
		t.Fatalf("nil config: %+v, %v", got, err)
	}

	in := &sample{Name: "a;b", Workers: 9, Wait: time.Microsecond}
	got, err = Resolve("sample", in, fill, check)
	if *in != (sample{Name: "a;b", Workers: 9, Wait: time.Microsecond}) {
		t.Errorf("Resolve modified its input: %+v", *in)
	}
	if got.Workers != 9 {
		t.Errorf("a set field was replaced by its default: %+v", got)
	}
	for _, want := range []string{
		"sample: Config.Workers (9) must be at most 8",
		"sample: Config.Wait (1µs) must be at least 1ms",
		"sample: Config.Name: bad name",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
	if !errors.Is(err, errBadName) {
		t.Errorf("Field does not wrap its error: %v", err)
	}
}
