package cdc

import "time"

// The source's fixed timeouts and intervals. The tunable ones are Config fields.
const (
	// StartTimeout bounds Start's set-up: the start-up checks, creating the
	// publication and the slot, taking ownership of unpublished events, and
	// waiting for the replication stream to be up.
	StartTimeout = 2 * time.Minute

	// StatementTimeout bounds one database round trip of the source (a mark, a
	// failure record, a read of the lanes the table path owns); a statement
	// that times out is retried with backoff.
	StatementTimeout = 10 * time.Second

	// SlotReleaseWait bounds how long a stop waits for the server to mark the
	// slot inactive after the replication connection closed, so that a restart
	// right away does not find it in use.
	SlotReleaseWait = 5 * time.Second

	// CollectTimeout bounds the database reads of one scrape of Collector.
	CollectTimeout = 5 * time.Second

	// HeartbeatLockTimeout bounds how long a heartbeat waits for a lock on
	// the outbox_relays table (StatementTimeout bounds the statement).
	HeartbeatLockTimeout = time.Second

	// StandbyHoldReport is how long a transaction may be held for the
	// synchronous standbys before Healthy reports ErrSyncStandbyBehind and the
	// source logs it.
	StandbyHoldReport = 5 * time.Second
)

const (
	// slotReleasePoll is how often the stop looks whether the slot is released.
	slotReleasePoll = 20 * time.Millisecond

	// brokerOutagePause is how long the dispatcher holds the stream when a whole
	// batch failed with the broker unreachable, unless the table path gets an
	// ack through first (brokerBack).
	brokerOutagePause = 10 * time.Second

	// markRetryInterval and markRetries: an acked event not yet visible to the
	// mark (its commit reaches logical decoding a moment before other sessions
	// see it) is looked for again every markRetryInterval, markRetries times.
	markRetryInterval = 100 * time.Millisecond
	markRetries       = 50

	// minStatusInterval is the least time between two standby status reports
	// prompted by a new confirmed position (Config.StatusInterval is the most).
	minStatusInterval = 100 * time.Millisecond

	// receiveWait bounds one wait for a message from the replication stream, so
	// that status reports and Stop are looked at between messages.
	receiveWait = 100 * time.Millisecond

	// backPressurePoll is how often a stream held by back-pressure (MaxBuffered
	// reached) looks again when no space is signalled.
	backPressurePoll = 100 * time.Millisecond

	// settleGrace is how long, beyond Config.PublishTimeout, a stopping stream
	// waits for the dispatcher to settle its last batch before its final status
	// report; idlePoll is how often it looks.
	settleGrace = 10 * time.Second
	idlePoll    = 10 * time.Millisecond

	// minTableWait is the shortest timer of the table path between rounds.
	minTableWait = time.Millisecond

	// standbyRecheck is how often synchronous_standby_names and the
	// standbys are read when nothing is held (a reload may change them).
	standbyRecheck = 5 * time.Second

	// slotCreateBackoff is the delay, times the attempt number, between tries to
	// create the slot after a serialization failure.
	slotCreateBackoff = 200 * time.Millisecond
)
