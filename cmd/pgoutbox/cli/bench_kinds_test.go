package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/redis/go-redis/v9"

	"github.com/pgoutbox/pgoutbox/broker/redisstream"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// A bench relay gets its broker kind's own settings and secrets from the
// bench's environment (the relays' environment drops every other PGOUTBOX_
// variable), and MQTT's client id is its own: two relays under one would
// take each other's session over.
func TestBenchRelayEnv(t *testing.T) {
	t.Setenv("PGOUTBOX_MQTT_PASSWORD", "Zmqtt-pw")
	t.Setenv("PGOUTBOX_MQTT_QOS", "2")
	t.Setenv("PGOUTBOX_MQTT_VERSION", "5")
	t.Setenv("PGOUTBOX_REDIS_PASSWORD", "Zredis-pw")
	t.Setenv("PGOUTBOX_REDIS_DEDUP_WINDOW", "1m")
	t.Setenv("PGOUTBOX_SCHEMA", "not-the-kinds")
	t.Setenv("PGOUTBOX_MQTT_CLIENT_ID", "")

	mqttEnv := benchRelayEnv("mqtt://app@127.0.0.1:1883", "bench-ab-1")
	for _, want := range []string{"PGOUTBOX_MQTT_PASSWORD=Zmqtt-pw", "PGOUTBOX_MQTT_QOS=2", "PGOUTBOX_MQTT_VERSION=5", "PGOUTBOX_MQTT_CLIENT_ID=bench-ab-1"} {
		if !slices.Contains(mqttEnv, want) {
			t.Errorf("mqtt: %q lacks %s", mqttEnv, want)
		}
	}
	if other := benchRelayEnv("mqtts://app@127.0.0.1:8883", "bench-ab-2"); !slices.Contains(other, "PGOUTBOX_MQTT_CLIENT_ID=bench-ab-2") {
		t.Errorf("a second relay: %q, want a client id of its own", other)
	}
	t.Setenv("PGOUTBOX_MQTT_CLIENT_ID", "site")
	if env := benchRelayEnv("mqtt://h", "bench-ab-1"); env[len(env)-1] != "PGOUTBOX_MQTT_CLIENT_ID=site-bench-ab-1" {
		t.Errorf("a client id the bench was given: %q, want it as the relays' prefix, last (it wins)", env)
	}
	redisEnv := benchRelayEnv("rediss://127.0.0.1:6379", "bench-ab-1")
	if !slices.Contains(redisEnv, "PGOUTBOX_REDIS_PASSWORD=Zredis-pw") || !slices.Contains(redisEnv, "PGOUTBOX_REDIS_DEDUP_WINDOW=1m") ||
		slices.ContainsFunc(redisEnv, func(e string) bool { return strings.Contains(e, "MQTT") }) {
		t.Errorf("redis: %q", redisEnv)
	}
	for _, env := range [][]string{mqttEnv, redisEnv, benchRelayEnv("nats://h:4222", "x"), benchRelayEnv("null", "x")} {
		if slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, "PGOUTBOX_SCHEMA=") }) {
			t.Errorf("%q passes on a variable that is not the kind's", env)
		}
	}
	if env := benchRelayEnv("embedded", "x"); len(env) != 0 {
		t.Errorf("embedded: %q, want nothing (no variable set)", env)
	}
	secrets := benchSecrets()
	for _, want := range []string{"Zmqtt-pw", "Zredis-pw"} {
		if !slices.Contains(secrets, want) {
			t.Errorf("benchSecrets %q lacks %s", secrets, want)
		}
	}
}

// Bench cells for MQTT and Redis Streams: a small drain through the real
// binary to the shared Mosquitto and Redis, one and two relays each, every
// event published. Two MQTT relays run only with a client id each.
func TestBenchMQTTAndRedisCells(t *testing.T) {
	t.Parallel()
	var r [6]byte
	_, _ = rand.Read(r[:])
	prefix := "benchtest-" + hex.EncodeToString(r[:])
	rdb := redis.NewClient(&redis.Options{Addr: sharedRedis, DisableIdentity: true})
	t.Cleanup(func() {
		ctx := context.Background()
		for _, pattern := range []string{prefix + "*", redisstream.DefaultDedupKeyPrefix + prefix + "*"} {
			keys, _ := rdb.Keys(ctx, pattern).Result()
			if len(keys) > 0 {
				_ = rdb.Del(ctx, keys...).Err()
			}
		}
		_ = rdb.Close()
	})

	jsonFile := filepath.Join(t.TempDir(), "bench.json")
	const events = 300
	cmd := exec.Command(binary, "bench", "--database-url", pgtest.URL(), "--scenario", "drain", "--sources", "poll",
		"--events", "300", "--aggregates", "10", "--relays", "1,2", "--batch-size", "50",
		"--broker", "mqtt://"+mqttAddr+",redis://"+sharedRedis, "--relay-arg=--topic-template="+prefix+".{aggregate_type}",
		"--json", jsonFile)
	benchRun(t, withEnv(cmd, "PGOUTBOX_MQTT_CLIENT_ID="+prefix))
	res := benchResult(t, jsonFile)
	// The relays' persistent sessions go with the test.
	t.Cleanup(func() {
		if res.Drain == nil {
			return
		}
		for _, run := range res.Drain.Runs {
			if !strings.HasPrefix(run.Broker, "mqtt://") {
				continue
			}
			for _, rss := range run.RelayRSS {
				c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + mqttAddr).
					SetClientID(prefix + "-" + rss.ID).SetCleanSession(true))
				if tok := c.Connect(); tok.WaitTimeout(30*time.Second) && tok.Error() == nil {
					c.Disconnect(250)
				}
			}
		}
	})
	if len(res.Errors) > 0 {
		t.Fatalf("bench errors: %+v", res.Errors)
	}
	if res.Drain == nil || len(res.Drain.Runs) != 4 {
		t.Fatalf("drain: want 4 runs (2 brokers × 1, 2 relays), got %+v", res.Drain)
	}
	for _, run := range res.Drain.Runs {
		if run.EventsPerSec <= 0 || len(run.RelayRSS) != run.Relays {
			t.Errorf("%s with %d relays: %+v", run.Broker, run.Relays, run)
		}
	}
	// Redis kept every event of each drain: events per run.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	keys, err := rdb.Keys(ctx, prefix+".*").Result()
	pgtest.Must(t, err, "list the streams")
	var n int64
	for _, k := range keys {
		l, err := rdb.XLen(ctx, k).Result()
		pgtest.Must(t, err, "XLEN %s", k)
		n += l
	}
	if n != 2*events {
		t.Errorf("the streams %v hold %d entries, want %d (two drains of %d)", keys, n, 2*events, events)
	}
}

// withEnv gives cmd this process's environment plus env.
func withEnv(cmd *exec.Cmd, env ...string) *exec.Cmd {
	cmd.Env = append(cmd.Environ(), env...)
	return cmd
}
