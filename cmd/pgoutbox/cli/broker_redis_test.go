package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/redisstream"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/wire"
)

const sharedRedis = "127.0.0.1:6379"

// A Redis password never comes from the URL, and a refusal does not repeat it;
// the password file's content never shows either.
func TestRedisBrokerFlags(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-redis-pw"
	_, errOut, code := run(t, "relay", "--database-url", pgtest.URL(), "--broker", "redis://app:"+secret+"@127.0.0.1:6379")
	if code != 2 || !strings.Contains(errOut, "password") || strings.Contains(errOut, secret) {
		t.Errorf("a password in the URL: exit %d, %q; want 2, refused without the password", code, errOut)
	}
	for _, args := range [][]string{
		{"--redis-max-len", "-1"},
		{"--redis-dedup-window", "0s"},
		{"--redis-password-file", filepath.Join(t.TempDir(), "missing")},
	} {
		all := append([]string{"relay", "--database-url", pgtest.URL(), "--broker", "redis://127.0.0.1:6379"}, args...)
		if _, errOut, code := run(t, all...); code != 2 || !strings.Contains(errOut, args[0]) {
			t.Errorf("%v: exit %d, %q; want 2 naming the flag", args, code, errOut)
		}
	}
	// A wrong password from the file: the server's refusal is a configuration
	// error at start, and the password is not in the output.
	file := filepath.Join(t.TempDir(), "pw")
	pgtest.Must(t, os.WriteFile(file, []byte(secret+"\n"), 0o600), "write")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errb strings.Builder
	_, schema := pgtest.Migrated(t, 2)
	code = Run(ctx, []string{"relay", "--database-url", pgtest.URL(), "--schema", schema, "--broker", "redis://nobody@" + sharedRedis,
		"--redis-password-file", file}, &out, &errb)
	if code != 2 || !strings.Contains(errb.String(), "WRONGPASS") || strings.Contains(errb.String()+out.String(), secret) {
		t.Errorf("a refused password: exit %d, %q", code, errb.String())
	}
}

// Acceptance: the real binary relays to Redis Streams, is SIGKILLed mid-run,
// and a second relay finishes: every event is in the stream once, in order
// per aggregate, the victim's re-published events dropped by the dedup script.
func TestRelayRedisSIGKILL(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 4)
	e := &relayEnv{t: t, pool: pool, dbURL: pgtest.URL(), schema: schema}
	rdb := redis.NewClient(&redis.Options{Addr: sharedRedis, DisableIdentity: true})
	var r [6]byte
	_, _ = rand.Read(r[:])
	prefix := "relaytest-" + hex.EncodeToString(r[:])
	stream := prefix + ".acct"
	t.Cleanup(func() {
		_ = rdb.Del(context.Background(), stream, redisstream.DefaultDedupKeyPrefix+stream).Err()
		_ = rdb.Close()
	})

	ids := e.enqueue(40, 25)
	start := func(id string) *relayProc {
		return startRelayProc(t, "relay "+id, nil, []string{"relay", "--database-url", pgtest.URL(), "--schema", schema,
			"--id", id, "--broker", "redis://" + sharedRedis, "--topic-template", prefix + ".{aggregate_type}",
			"--batch-size", "50", "--lease", "2s", "--publish-timeout", "1s"})
	}
	victim := start("victim")
	wait.For(t, time.Minute, "publishing to begin", func() bool { return e.count("published_at IS NOT NULL") > 0 })
	victim.kill(t)
	left := e.count("published_at IS NULL")

	successor := start("successor")
	wait.For(t, 2*time.Minute, "the successor to publish everything", func() bool { return e.count("published_at IS NULL") == 0 })
	successor.stopClean(t, "successor")
	if !strings.Contains(victim.stderr.String(), "persists nothing") {
		t.Errorf("no persistence warning from a server without persistence:\n%s", victim.stderr.String())
	}

	entries, err := rdb.XRange(context.Background(), stream, "-", "+").Result()
	pgtest.Must(t, err, "XRANGE")
	got := make([]broker.Message, 0, len(entries))
	for _, en := range entries {
		fields := map[string]string{}
		var names []string
		for k, v := range en.Values {
			fields[k] = v.(string)
			if k != "body" {
				names = append(names, k)
			}
		}
		m, err := wire.ParseReceived([]byte(fields["body"]), names, func(n string) string { return fields[n] })
		pgtest.Must(t, err, "entry %s", en.ID)
		got = append(got, m)
	}
	if dups := brokertest.CheckStream(t, got, ids); dups != 0 {
		t.Errorf("%d duplicates in the stream: the dedup script should drop re-publishes within its window", dups)
	}
	t.Logf("%d events, %d left when the victim died", len(ids), left)
}
