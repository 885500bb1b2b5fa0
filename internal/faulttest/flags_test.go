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

	faultSoakDuration = flag.Duration("faultsoak.duration", 0, "how long the soak across faults cycles them (0: one cycle, the CI-sized run)")
	faultSoakPhase    = flag.Duration("faultsoak.phase", 3*time.Second, "how long each fault of the soak across faults lasts")
)

// flagsParse parses the command line for TestMain (testing's flags included).
func flagsParse() { flag.Parse() }
