// Package faulttest is pgoutbox's fault-injection suite (docs/design.md,
// "Verification"). Its tests run real OS processes — the pgoutbox relay binary,
// and the producer and consumer programs under cmd/ — kill them at every named
// failpoint (internal/failpoint) and at random moments, cut their database
// connections, restart their NATS server, pause a relay past its lease, cut a
// relay's host off the database or the broker (a network namespace of its own,
// internal/netns), and then ask package checker whether every guarantee of the
// README held.
//
// The tenant tests (tenants_test.go) run relays serving many outboxes from a
// --tenants-file — schemas of two databases of a server of their own, all
// tenants' events in one stream under subjects that name the tenant — and run
// the checker per tenant on its own subjects: relays SIGKILLed and restarted,
// a tenant database and a tenant schema dropped mid-run (the others flow on,
// /readyz names the lost ones), a tenant migrated while the relays run.
//
// The destinations test (destinations_test.go) runs relays with a
// --destinations-file of three destinations on three brokers (NATS JetStream,
// RabbitMQ, a webhook of the test's own) with different rules, kills them at
// every relay failpoint, blocks the webhook (503) until the other two have every
// event of theirs, heals it, and runs the checker per destination.
//
// The chaos soak runs for about a minute in the default test run; run the long
// one with
//
//	go test ./internal/faulttest -run '^TestSoak$' -soak.duration=30m -timeout 0
//
// The soak across faults (TestFaultSoak) cycles a relay SIGKILL, terminated
// database sessions, a broker restart, network cuts of a relay's host and a
// failover of the primary to its synchronous standby under steady load with
// cleanup running; the default run is one cycle of 3s faults. Run it for hours
// with
//
//	go test ./internal/faulttest -run TestFaultSoak -faultsoak.duration=2h -timeout 0
package faulttest
