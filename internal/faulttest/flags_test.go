package faulttest

import (
	"flag"
	"time"
)

var (
	soakDuration  = flag.Duration("soak.duration", 45*time.Second, "how long the chaos soak kills processes (the default is the CI-sized run)")
	soakRelays    = flag.Int("soak.relays", 3, "relay processes in the soak")
	soakConsumers = flag.Int("soak.consumers", 2, "consumer processes in the soak")
	soakProducers = flag.Int("soak.producers", 2, "producer processes in the soak")
)

// flagsParse parses the command line for TestMain (testing's flags included).
func flagsParse() { flag.Parse() }
