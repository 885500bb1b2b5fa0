package kafka_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/kafka"
)

// A broker that hangs up on the SASL exchange instead of answering is not
// "credentials refused": the same bare EOF comes from a broker restarting or a
// proxy cutting the connection, and treating it as a configuration error would
// stop a relay (exit 2) where waiting is right. Real Kafka answers
// SASL_AUTHENTICATION_FAILED before closing (KIP-152), which IsAuthError
// recognises (cmd/pgoutbox/cli's kafka_auth_test.go proves the relay's exit 2
// end to end). kfake is such a broker that hangs up: on wrong PLAIN or SCRAM
// credentials its SaslAuthenticate handler returns an error, and kfake closes
// the connection; no option changes that. This test pins both: if kfake ever
// answers like Kafka, it fails, and the control function of the CLI test can go.
func TestSASLHangUpIsNotAuthError(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.EnableSASL(), kfake.Superuser("PLAIN", "relay", "right-pw"),
		kfake.Superuser("SCRAM-SHA-256", "relay", "right-pw"), kfake.Superuser("SCRAM-SHA-512", "relay", "right-pw"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	addr := c.ListenAddrs()[0]
	for _, u := range []string{
		"kafka://relay:wr0ng-pw@" + addr + "?sasl=plain",
		"kafka://nobody:wr0ng-pw@" + addr + "?sasl=plain",
		"kafka://relay:wr0ng-pw@" + addr + "?sasl=scram-sha-256",
		"kafka://nobody:wr0ng-pw@" + addr + "?sasl=scram-sha-256",
		"kafka://relay:wr0ng-pw@" + addr + "?sasl=scram-sha-512",
		"kafka://nobody:wr0ng-pw@" + addr + "?sasl=scram-sha-512",
		"kafka://relay:right-pw@" + addr + "?sasl=plain", // control
		"kafka://relay:right-pw@" + addr + "?sasl=scram-sha-512",
	} {
		p, err := kafka.Dial(t.Context(), u, &kafka.Config{})
		if err != nil {
			t.Fatalf("Dial: %v", err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		err = p.Ping(ctx)
		cancel()
		_ = p.Close()
		display := strings.Replace(u, "-pw@", "-…@", 1)
		if strings.Contains(u, "right-pw") {
			if err != nil {
				t.Errorf("%s: Ping: %v", display, err)
			}
			continue
		}
		if !errors.Is(err, io.EOF) || kafka.IsAuthError(err) || !broker.IsUnavailable(err) {
			t.Errorf("%s: Ping: %v (auth error %v); want kfake's hang-up, unavailable and not an auth error", display, err, kafka.IsAuthError(err))
		}
	}
}
