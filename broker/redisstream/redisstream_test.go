package redisstream_test

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/redisstream"
	"github.com/pgoutbox/pgoutbox/internal/logtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/wire"
)

func TestParseURL(t *testing.T) {
	t.Parallel()
	good := map[string]string{
		"redis://localhost":            "localhost:6379",
		"redis://app@10.0.0.1:7000/3":  "10.0.0.1:7000",
		"rediss://cache.example:6380/": "cache.example:6380",
		"redis://[::1]:6379":           "[::1]:6379",
	}
	for in, addr := range good {
		o, err := redisstream.ParseURL(in)
		if err != nil || o.Addr != addr {
			t.Errorf("ParseURL(%q) = %+v, %v; want address %s", in, o, err, addr)
			continue
		}
		if (o.TLSConfig != nil) != strings.HasPrefix(in, "rediss:") {
			t.Errorf("ParseURL(%q): TLS %v", in, o.TLSConfig != nil)
		}
	}
	if o, _ := redisstream.ParseURL("redis://app@h:1/3"); o.Username != "app" || o.DB != 3 {
		t.Errorf("user and db: %+v", o)
	}
	for _, in := range []string{
		"", "localhost:6379", "http://h", "redis://", "redis://h:0", "redis://h:99999",
		"redis://h/x", "redis://h/-1", "redis://h?db=1", "redis://h#f", "redis:opaque",
		"redis://h/" + strings.Repeat("1", 3000),
	} {
		if _, err := redisstream.ParseURL(in); err == nil {
			t.Errorf("ParseURL(%q) accepted", in)
		}
	}
	const secret = "s3cr3t-pw"
	for _, in := range []string{"redis://app:" + secret + "@h:6379", "redis://:" + secret + "@h", "redis://u:" + secret + "@h:%zz"} {
		_, err := redisstream.ParseURL(in)
		if err == nil || strings.Contains(err.Error(), secret) {
			t.Errorf("ParseURL with a password: %v; want an error that does not repeat it", err)
		}
	}
}

// FuzzParseURL: no input panics, and a refusal never repeats a password.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{"redis://h", "rediss://u@h:1/2", "redis://u:pw@h", "redis://[::1", "redis://h/%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		o, err := redisstream.ParseURL(s)
		if err == nil {
			if o.Password != "" || o.Addr == "" {
				t.Fatalf("ParseURL(%q) = %+v", s, o)
			}
			return
		}
		if u, perr := url.Parse(s); perr == nil {
			if pw, ok := u.User.Password(); ok && len(pw) >= 4 && strings.Contains(err.Error(), pw) {
				t.Fatalf("ParseURL(%q): %v repeats the password", s, err)
			}
		}
	})
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	if err := (*redisstream.Config)(nil).Validate(); err != nil {
		t.Fatalf("nil config: %v", err)
	}
	err := (&redisstream.Config{
		DedupWindow: -time.Second, MaxLen: -1, MaxMessageBytes: redisstream.HardMaxMessageBytes + 1,
		Timeout: -1, MaxPipeline: -1, DedupKeyPrefix: "bad\nprefix",
	}).Validate()
	for _, field := range []string{"DedupWindow", "MaxLen", "MaxMessageBytes", "Timeout", "MaxPipeline", "DedupKeyPrefix"} {
		if err == nil || !strings.Contains(err.Error(), "Config."+field) {
			t.Errorf("error %v does not name Config.%s", err, field)
		}
	}
}

// TestEntryLayout checks an entry's fields: the wire headers, content-type and
// body, in that order.
func TestEntryLayout(t *testing.T) {
	t.Parallel()
	c := client(t, mustAddr(t, sharedURL))
	cfg, prefix := isolated(t, c)
	p := dial(t, sharedURL, cfg)
	m := brokertest.Message("order", "42", 1)
	if err := brokertest.Publish(t, p, m)[0]; err != nil {
		t.Fatal(err)
	}
	entries, err := c.XRange(t.Context(), prefix+".order", "-", "+").Result()
	if err != nil || len(entries) != 1 {
		t.Fatalf("XRANGE: %v, %v", entries, err)
	}
	got := entries[0].Values
	for k, v := range m.WireHeaders() {
		if got[k] != v {
			t.Errorf("field %s = %v, want %q", k, got[k], v)
		}
	}
	if got["content-type"] != wire.DefaultContentType || got["body"] != string(m.Payload) {
		t.Errorf("content-type %v, body %v", got["content-type"], got["body"])
	}
	if want := len(m.WireHeaders()) + 2; len(got) != want {
		t.Errorf("%d fields, want %d: %v", len(got), want, got)
	}
}

// TestRefusals checks what is refused permanently before or by the server,
// and that the aggregate's later events are then not sent.
func TestRefusals(t *testing.T) {
	t.Parallel()
	c := client(t, mustAddr(t, sharedURL))
	cfg, prefix := isolated(t, c)
	cfg.MaxMessageBytes = 1024
	p := dial(t, sharedURL, cfg)

	// A key that is not a stream: WRONGTYPE from the server.
	if err := c.Set(t.Context(), prefix+".taken", "x", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	results := brokertest.Publish(t, p, brokertest.Message("taken", "1", 1), brokertest.Message("taken", "1", 2))
	if !broker.IsPermanent(results[0]) || !strings.Contains(results[0].Error(), "WRONGTYPE") {
		t.Errorf("XADD to a string key: %v, want a permanent WRONGTYPE", results[0])
	}
	if !errors.Is(results[1], broker.ErrPredecessorFailed) {
		t.Errorf("the next event of the aggregate: %v, want ErrPredecessorFailed", results[1])
	}

	big := brokertest.Message("order", "1", 1)
	big.Payload = []byte(`"` + strings.Repeat("x", 1100) + `"`)
	body := brokertest.Message("order", "2", 1)
	body.Headers["Body"] = "spoof"
	long := brokertest.Message(strings.Repeat("a", redisstream.MaxStreamNameBytes), "3", 1)
	ctrl := brokertest.Message("a\x01b", "4", 1)
	for i, err := range brokertest.Publish(t, p, big, body, long, ctrl) {
		if !broker.IsPermanent(err) {
			t.Errorf("message %d: %v, want a permanent refusal", i, err)
		}
	}
}

// TestDedupWindow checks that an event id is appended once within the window
// and again after it, and that MaxLen trims.
func TestDedupWindow(t *testing.T) {
	t.Parallel()
	c := client(t, mustAddr(t, sharedURL))
	cfg, prefix := isolated(t, c)
	cfg.DedupWindow = 500 * time.Millisecond
	p := dial(t, sharedURL, cfg)
	m := brokertest.Message("order", "1", 1)
	for range 2 {
		if err := brokertest.Publish(t, p, m)[0]; err != nil {
			t.Fatal(err)
		}
	}
	count := func() int64 { return c.XLen(t.Context(), prefix+".order").Val() }
	if n := count(); n != 1 {
		t.Fatalf("%d entries after a repeat within the window, want 1", n)
	}
	// Once the dedup set has expired, the id is new again.
	dedupKey := redisstream.DefaultDedupKeyPrefix + prefix + ".order"
	wait.For(t, 60*time.Second, "the dedup set to expire", func() bool { return c.Exists(t.Context(), dedupKey).Val() == 0 })
	if err := brokertest.Publish(t, p, m)[0]; err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 2 {
		t.Fatalf("%d entries after a repeat beyond the window, want 2", n)
	}

	cfg2, prefix2 := isolated(t, c)
	cfg2.MaxLen = 10
	trim := dial(t, sharedURL, cfg2)
	msgs := make([]broker.Message, 300)
	for i := range msgs {
		msgs[i] = brokertest.Message("order", "1", int64(i+1))
	}
	for i, err := range brokertest.Publish(t, trim, msgs...) {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	if n := c.XLen(t.Context(), prefix2+".order").Val(); n >= 300 {
		t.Errorf("%d entries with MaxLen 10: not trimmed", n)
	}
}

// TestCredentialsAndPersistence runs a server of its own that wants a
// password: refused credentials and commands are configuration errors, and
// Dial warns about a server that persists nothing.
func TestCredentialsAndPersistence(t *testing.T) {
	t.Parallel()
	srv := startServer(t, "--requirepass", "right-pw", "--appendonly", "no")
	for _, pw := range []string{"", "wrong-pw"} {
		_, err := redisstream.Dial(t.Context(), srv.url(), &redisstream.Config{Password: pw, Logger: quiet})
		if !broker.IsMisconfigured(err) || (pw != "" && strings.Contains(err.Error(), pw)) {
			t.Errorf("Dial with password %q: %v, want a misconfiguration that does not repeat it", pw, err)
		}
	}
	var log logtest.Buffer
	p := dial(t, srv.url(), &redisstream.Config{Password: "right-pw", Logger: log.Logger()})
	if !strings.Contains(log.String(), "persists nothing") {
		t.Errorf("no persistence warning; log:\n%s", log.String())
	}
	if strings.Contains(log.String(), "right-pw") {
		t.Error("the log holds the password")
	}

	// A user that may not run scripts.
	admin := redis.NewClient(&redis.Options{Addr: srv.addr(), Password: "right-pw", DisableIdentity: true})
	defer admin.Close()
	if err := admin.Do(t.Context(), "ACL", "SETUSER", "limited", "on", ">limited-pw", "~*", "+ping").Err(); err != nil {
		t.Fatal(err)
	}
	log = logtest.Buffer{}
	limited := dial(t, "redis://limited@"+srv.addr(), &redisstream.Config{Password: "limited-pw", Logger: log.Logger()})
	if !strings.Contains(log.String(), "could not check") {
		t.Errorf("no warning that persistence could not be checked; log:\n%s", log.String())
	}
	if err := brokertest.Publish(t, limited, brokertest.Message("order", "1", 1))[0]; !broker.IsMisconfigured(err) {
		t.Errorf("a publish without the permission: %v, want a misconfiguration", err)
	}
	if err := brokertest.Publish(t, p, brokertest.Message("order", "1", 1))[0]; err != nil {
		t.Errorf("a publish with the password: %v", err)
	}
}

// TestUnreachable checks that a server that is down is an outage, never a
// refusal, and that the publisher recovers when it comes up.
func TestUnreachable(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	if err := srv.stop(); err != nil {
		t.Fatal(err)
	}
	p := dial(t, srv.url(), &redisstream.Config{Logger: quiet, Timeout: 2 * time.Second})
	brokertest.CheckUnreachable(t, p, brokertest.Message("order", "1", 1), brokertest.Message("order", "1", 2), brokertest.Message("invoice", "1", 1))
	if err := srv.start(); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 60*time.Second, "a publish to succeed", func() bool {
		return brokertest.Publish(t, p, brokertest.Message("order", "1", 1))[0] == nil
	})
	_ = p.Close()
	if err := brokertest.Publish(t, p, brokertest.Message("order", "1", 2))[0]; !broker.IsUnavailable(err) {
		t.Errorf("publish after Close: %v, want unavailable", err)
	}
}
