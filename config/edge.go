package config

import (
	_ "embed" // EdgeExampleTOML
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"time"

	"github.com/ingestorhq/ingestor/internal/edge"
)

// EdgeExampleTOML is edge.example.toml: the file of `ingestor edge -c`,
// every key documented with its default.
//
//go:embed edge.example.toml
var EdgeExampleTOML string

// Edge is the [edge] section of the edge forwarder's own config file (not
// the daemon's): what `ingestor edge -c FILE` runs with.
type Edge struct {
	// File is the path the config was loaded from.
	File string
	// URL is the daemon's ws_ingress endpoint, ws:// or wss://. Required.
	URL string
	// Token is the bearer token, from token or token_file. Required. It is
	// never logged.
	Token string
	// CAFile is a PEM file of the CAs that sign the daemon's certificate.
	CAFile string
	// DeviceID fills the device_id of events without one. Required.
	DeviceID string
	// Outbox is the outbox's SQLite file. Default ./edge/outbox.db.
	Outbox string
	// MaxOutboxBytes bounds the envelopes waiting for their ACK. Default 256 MiB.
	MaxOutboxBytes int64
	// MaxEnvelopeBytes bounds one envelope. Default 1 MiB.
	MaxEnvelopeBytes int
	// HTTP is the loopback address of POST /events; "" is off.
	HTTP string
	// Socket is the path of the Unix socket input; "" is off.
	Socket string
	// Stdin reads NDJSON from standard input.
	Stdin bool
	// Metrics is the address of GET /metrics; "" is off.
	Metrics string
	// Window is how many envelopes may wait for their ACK. Default 64.
	Window int
	// AckTimeout, ReconnectBase, ReconnectMax: see edge.Options.
	AckTimeout, ReconnectBase, ReconnectMax time.Duration
}

// edgeTOML is [edge] as written in the file.
type edgeTOML struct {
	URL              string   `toml:"url"`
	Token            string   `toml:"token"`
	TokenFile        string   `toml:"token_file"`
	CAFile           string   `toml:"ca_file"`
	DeviceID         string   `toml:"device_id"`
	Outbox           string   `toml:"outbox"`
	MaxOutboxBytes   int64    `toml:"max_outbox_bytes"`
	MaxEnvelopeBytes int64    `toml:"max_envelope_bytes"`
	HTTP             string   `toml:"http"`
	Socket           string   `toml:"socket"`
	Stdin            bool     `toml:"stdin"`
	Metrics          string   `toml:"metrics"`
	Window           int64    `toml:"window"`
	AckTimeout       duration `toml:"ack_timeout"`
	ReconnectBase    duration `toml:"reconnect_base"`
	ReconnectMax     duration `toml:"reconnect_max"`
}

// LoadEdge reads and parses the edge forwarder's config file at path,
// resolving ${NAME} from the process environment.
func LoadEdge(path string) (*Edge, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	return ParseEdgeWithEnv(path, data, os.LookupEnv)
}

// ParseEdgeWithEnv parses data, the edge forwarder's config file named
// file, with lookup resolving ${NAME}: defaults, strict decode, then
// validation, every problem returned at once as Errors, as ParseWithEnv
// does for the daemon's file. The file has one table, [edge].
func ParseEdgeWithEnv(file string, data []byte, lookup func(string) (string, bool)) (*Edge, error) {
	d, top, err := newDecoder(file, data, lookup)
	if err != nil {
		return nil, err
	}
	for _, k := range slices.Sorted(maps.Keys(top)) {
		if k != "edge" {
			d.unknown([]string{k})
		}
	}
	t := edgeTOML{
		Outbox:           edge.DefaultOutbox,
		MaxOutboxBytes:   edge.DefaultMaxOutboxBytes,
		MaxEnvelopeBytes: edge.DefaultMaxEnvelopeBytes,
		Window:           edge.DefaultWindow,
		AckTimeout:       duration(edge.DefaultAckTimeout.String()),
		ReconnectBase:    duration(edge.DefaultReconnectBase.String()),
		ReconnectMax:     duration(edge.DefaultReconnectMax.String()),
	}
	p := []string{"edge"}
	if _, ok := top["edge"]; !ok {
		d.errAt(p, "the file needs an [edge] table with at least url, token or token_file, and device_id")
	}
	d.section(top, "edge", &t)
	at := func(key string) []string { return child(p, key) }
	switch msg := edge.CheckURL(t.URL); {
	case msg == "" || d.covered(at("url")):
	case t.URL == "":
		d.errAt(at("url"), "%s", msg)
	default:
		d.errAt(at("url"), "%s, not %s", msg, d.show(at("url"), t.URL))
	}
	token := d.token(at("token"), at("token_file"), t.Token, t.TokenFile, "token", edge.CheckToken)
	if token == "" && !d.covered(at("token")) && !d.covered(at("token_file")) {
		d.errAt(at("token"), `is required (the daemon answers 401 without it): set token = "${EDGE_TOKEN}" or token_file`)
	}
	if msg := edge.CheckID(t.DeviceID); msg != "" {
		d.errAt(at("device_id"), "%s", msg)
	}
	if t.Outbox == "" {
		d.errAt(at("outbox"), "must not be empty")
	}
	d.intRange(at("max_envelope_bytes"), t.MaxEnvelopeBytes, 1024, 64<<20)
	d.intRange(at("max_outbox_bytes"), t.MaxOutboxBytes, max(t.MaxEnvelopeBytes, 1024), 1<<50)
	d.intRange(at("window"), t.Window, 1, 10_000)
	if t.HTTP != "" {
		if msg := edge.CheckHTTPAddr(t.HTTP); msg != "" {
			d.errAt(at("http"), "%s", msg)
		}
	}
	if t.Metrics != "" {
		if _, _, err := net.SplitHostPort(t.Metrics); err != nil {
			d.errAt(at("metrics"), `must be host:port such as "127.0.0.1:9466", not %s`, d.show(at("metrics"), t.Metrics))
		}
	}
	if t.HTTP == "" && t.Socket == "" && !t.Stdin && !d.covered(p) {
		d.errAt(p, "no input: set http, socket or stdin = true")
	}
	e := &Edge{
		File: file, URL: t.URL, Token: token, CAFile: t.CAFile, DeviceID: t.DeviceID, Outbox: t.Outbox,
		MaxOutboxBytes: t.MaxOutboxBytes, MaxEnvelopeBytes: int(t.MaxEnvelopeBytes),
		HTTP: t.HTTP, Socket: t.Socket, Stdin: t.Stdin, Metrics: t.Metrics, Window: int(t.Window),
		AckTimeout:    d.duration(at("ack_timeout"), t.AckTimeout, edge.DefaultAckTimeout),
		ReconnectBase: d.duration(at("reconnect_base"), t.ReconnectBase, edge.DefaultReconnectBase),
		ReconnectMax:  d.duration(at("reconnect_max"), t.ReconnectMax, edge.DefaultReconnectMax),
	}
	if e.ReconnectMax < e.ReconnectBase {
		d.errAt(at("reconnect_max"), "%v is less than reconnect_base %v", e.ReconnectMax, e.ReconnectBase)
	}
	d.undecoded()
	if err := d.result(); err != nil {
		return nil, err
	}
	return e, nil
}
