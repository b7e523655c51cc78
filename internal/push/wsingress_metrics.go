package push

import (
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// maxDeviceLabels caps the device label values of one ws_ingress source:
// the first maxDeviceLabels device ids seen since the daemon started get
// their own series, every later one is counted under otherDevice.
const maxDeviceLabels = 1000

// otherDevice is the device label of the devices beyond maxDeviceLabels,
// and of envelopes whose device could not be read.
const otherDevice = "_other"

// wsMetrics are the metrics of the ws_ingress kind, part of Metrics.
type wsMetrics struct {
	connected *prometheus.GaugeVec
	envelopes *prometheus.CounterVec
	seqGaps   *prometheus.CounterVec
	seqResets *prometheus.CounterVec
	lastSeq   *prometheus.GaugeVec
}

func newWSMetrics() *wsMetrics {
	return &wsMetrics{
		connected: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ingestor_push_devices_connected",
			Help: "WebSocket connections open on a ws_ingress source."}, []string{"source"}),
		envelopes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ingestor_push_device_envelopes_total",
			Help: fmt.Sprintf("Envelopes answered on a ws_ingress source, by device and answer: stored, duplicate (stored again), rejected or retry. "+
				"The first %d device ids of a source get their own series, the rest count as device %q.", maxDeviceLabels, otherDevice)},
			[]string{"source", "device", "status"}),
		seqGaps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ingestor_device_seq_gaps_total",
			Help: "Ranges of seq numbers a device skipped (still missing after seq_gap_grace): events lost before they reached the daemon."},
			[]string{"source"}),
		seqResets: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ingestor_device_seq_resets_total",
			Help: "Times a device's seq went back to a number it had used (its outbox was reset)."}, []string{"source"}),
		lastSeq: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ingestor_device_last_seq",
			Help: fmt.Sprintf("The highest seq stored of each device since the daemon started; only the first %d device ids of a source get a series.", maxDeviceLabels)},
			[]string{"source", "device"}),
	}
}

func (m *wsMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.connected, m.envelopes, m.seqGaps, m.seqResets, m.lastSeq}
}

// deviceLabels hands out the device label values of one source, at most
// maxDeviceLabels of them.
type deviceLabels struct {
	mu   sync.Mutex
	seen map[string]struct{}
}

// label returns device's label value: device itself while the cap allows,
// otherDevice beyond it or for an empty id.
func (l *deviceLabels) label(device string) string {
	if device == "" {
		return otherDevice
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen[device]; ok {
		return device
	}
	if l.seen == nil {
		l.seen = make(map[string]struct{})
	}
	if len(l.seen) >= maxDeviceLabels {
		return otherDevice
	}
	l.seen[device] = struct{}{}
	return device
}
