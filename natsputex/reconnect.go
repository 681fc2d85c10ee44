package natsputex

import (
	"time"

	"github.com/nats-io/nats.go"
)

// ConnectOptions returns the [nats.Option]s a connection used by natsputex
// should have, to pass to [nats.Connect] before options of your own:
//
//   - reconnect forever ([nats.MaxReconnects](-1)): nats.go gives up after
//     60 attempts by default, and a closed connection ends every lease and
//     watch of its clients for good;
//   - every 100 ms with up to 100 ms of jitter (1 s with TLS)
//     ([nats.ReconnectWait], [nats.ReconnectJitter]) rather than nats.go's
//     2 s, which alone is longer than T − margin with a short T, so that a
//     holder whose server restarted renews again in time;
//   - no buffering of writes while reconnecting ([nats.ReconnectBufSize](-1)):
//     nats.go refuses a write made while the connection is down rather
//     than send it after the reconnect, seconds after its caller gave up
//     on it. natsputex sends such a write again itself once the connection
//     is back, while the write's own bound lasts (a renewal's: the lease's
//     validity), so a holder whose server restarted within that keeps its
//     lease. A renewal already sent when the connection dropped gets no
//     answer, and its lease ends at its deadline (see the package doc).
//
// ConnectOptions is safe to call from several goroutines.
func ConnectOptions() []nats.Option {
	return []nats.Option{
		nats.MaxReconnects(-1),
		nats.ReconnectWait(100 * time.Millisecond),
		nats.ReconnectJitter(100*time.Millisecond, time.Second),
		nats.ReconnectBufSize(-1),
	}
}
