// Package logattr holds what the JSON logs of the ingestor's binaries
// share, so that a log pipeline reads them all alike.
package logattr

import "log/slog"

// DurationSeconds is a slog.HandlerOptions.ReplaceAttr for JSON logs: a
// duration is written as its seconds, a number such as 301.55, instead of
// slog's integer nanoseconds (301549999530), which nobody reads right at
// 3 a.m. Text logs keep slog's "5m1.55s".
func DurationSeconds(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.Float64(a.Key, a.Value.Duration().Seconds())
	}
	return a
}
