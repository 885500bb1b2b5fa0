// Package kafkalog hands franz-go's log lines to log/slog: the one adapter the
// Kafka publisher (broker/kafka) and subscriber (inbox/kafkainbox) share.
//
// Imports franz-go's kgo, which only the Kafka packages link.
package kafkalog

import (
	"context"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kgo"
)

// New returns a kgo.Logger that writes to l, each message prefixed "kafka: ".
// franz-go logs at info what is debugging detail for a relay or a consumer
// (connections, heartbeats, metadata, fetch sessions), so those lines go to
// slog's debug level and are produced only when l's handler wants them;
// warnings and errors keep their level.
func New(l *slog.Logger) kgo.Logger { return logger{l} }

type logger struct{ l *slog.Logger }

func (k logger) Level() kgo.LogLevel {
	if k.l.Enabled(context.Background(), slog.LevelDebug) {
		return kgo.LogLevelInfo
	}
	return kgo.LogLevelWarn
}

func (k logger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	l := slog.LevelDebug
	switch level {
	case kgo.LogLevelError:
		l = slog.LevelError
	case kgo.LogLevelWarn:
		l = slog.LevelWarn
	}
	k.l.Log(context.Background(), l, "kafka: "+msg, keyvals...)
}
