// Package deploy holds no code: it is the home of pgoutbox's deployment starting
// points, and its tests check them against the code.
//
//	grafana/pgoutbox.json            Grafana dashboard of the relay, CDC and inbox metrics
//	prometheus/alerts.yml            Prometheus alerting rules (runbook: docs/operations.md)
//	prometheus/alerts_test.yml       promtool unit tests of every alert
//	systemd/pgoutbox-relay.service   a hardened systemd unit for the relay
//	kubernetes/relay.yaml            a Deployment and a Service for the relay
//
// go test ./deploy runs promtool check rules and promtool test rules, has
// promtool parse every dashboard expression, checks
// that every metric the dashboard and the rules query is one the code
// registers, and that the systemd unit and the Kubernetes manifest pass only
// flags `pgoutbox relay --help` lists, probe the health server's endpoints and
// wait longer than the relay's --shutdown-timeout (and has systemd-analyze
// verify the unit and rate its hardening).
package deploy
