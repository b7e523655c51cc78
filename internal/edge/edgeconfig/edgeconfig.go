package edgeconfig

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ingestorhq/ingestor/internal/devicewire"
)

// The defaults of Config.
const (
	DefaultOutbox           = "./edge/outbox.db"
	DefaultMaxOutboxBytes   = 256 << 20
	DefaultMaxEnvelopeBytes = devicewire.DefaultMaxEnvelopeBytes
	DefaultWindow           = devicewire.DefaultWindow
	DefaultAckTimeout       = 30 * time.Second
	DefaultReconnectBase    = 500 * time.Millisecond
	DefaultReconnectMax     = 30 * time.Second
)

// The bounds Validate checks.
const (
	minEnvelopeBytes = 1024
	maxOutboxBytes   = 1 << 50
	maxWindow        = 10_000
)

// Config is the forwarder's configuration: the [edge] table of its config
// file, key by key. Default returns one with every default set; URL,
// Token and DeviceID are required.
type Config struct {
	// URL is the daemon's ws_ingress endpoint,
	// ws://HOST:PORT/ingest/NAME/ws or wss://....
	URL string `toml:"url"`
	// Token is the bearer token sent on the handshake. It is never logged.
	Token string `toml:"token"`
	// TokenFile names a file holding the token (surrounding whitespace
	// trimmed), for a config file that does not set token; config.LoadEdge
	// reads it into Token, which is what the forwarder uses.
	TokenFile string `toml:"token_file"`
	// CAFile, when set, is a PEM file of the CAs that sign the daemon's
	// certificate (wss:// with a private CA); default the system's.
	CAFile string `toml:"ca_file"`
	// DeviceID fills the device_id of events that have none.
	DeviceID string `toml:"device_id"`
	// Outbox is the SQLite file of the outbox. Default DefaultOutbox.
	Outbox string `toml:"outbox"`
	// MaxOutboxBytes bounds the bytes of the envelopes waiting for their
	// ACK; new events are refused beyond it. Default 256 MiB.
	MaxOutboxBytes int64 `toml:"max_outbox_bytes"`
	// MaxEnvelopeBytes bounds one envelope; it must not exceed what the
	// daemon accepts in one message (its max_message_bytes). Default 1 MiB.
	MaxEnvelopeBytes int `toml:"max_envelope_bytes"`
	// HTTPAddr, when set, serves POST /events on this loopback address.
	HTTPAddr string `toml:"http"`
	// Socket, when set, is the path of a Unix socket (mode 0600) taking
	// NDJSON, one reply line per event.
	Socket string `toml:"socket"`
	// Stdin reads NDJSON events from standard input.
	Stdin bool `toml:"stdin"`
	// MetricsAddr, when set, serves GET /metrics.
	MetricsAddr string `toml:"metrics"`
	// Window is how many envelopes may wait for their ACK at once.
	// Default 64.
	Window int `toml:"window"`
	// AckTimeout is how long an envelope may wait for its answer before
	// the connection is dropped and made again (which resends it).
	// Default 30s.
	AckTimeout time.Duration `toml:"ack_timeout"`
	// ReconnectBase and ReconnectMax are the capped exponential backoff,
	// with full jitter, between connection attempts. Default 500ms, 30s.
	ReconnectBase time.Duration `toml:"reconnect_base"`
	ReconnectMax  time.Duration `toml:"reconnect_max"`
}

// Default returns a Config with every default set.
func Default() Config {
	return Config{Outbox: DefaultOutbox, MaxOutboxBytes: DefaultMaxOutboxBytes, MaxEnvelopeBytes: DefaultMaxEnvelopeBytes,
		Window: DefaultWindow, AckTimeout: DefaultAckTimeout, ReconnectBase: DefaultReconnectBase, ReconnectMax: DefaultReconnectMax}
}

// WithDefaults returns c with every zero field that has a default set to it.
func (c Config) WithDefaults() Config {
	def := Default()
	orDefault(&c.Outbox, def.Outbox)
	orDefault(&c.MaxOutboxBytes, def.MaxOutboxBytes)
	orDefault(&c.MaxEnvelopeBytes, def.MaxEnvelopeBytes)
	orDefault(&c.Window, def.Window)
	orDefault(&c.AckTimeout, def.AckTimeout)
	orDefault(&c.ReconnectBase, def.ReconnectBase)
	orDefault(&c.ReconnectMax, def.ReconnectMax)
	return c
}

// orDefault sets *p to def when it is the zero value.
func orDefault[T comparable](p *T, def T) {
	var zero T
	if *p == zero {
		*p = def
	}
}

// FieldError is a problem with one key of the [edge] table. The config
// package adds the file and line.
type FieldError struct {
	// Key is the TOML key the problem is about; "" for the table itself.
	Key string
	// Msg says what is wrong with it.
	Msg string
}

func (e FieldError) Error() string {
	if e.Key == "" {
		return e.Msg
	}
	return e.Key + ": " + e.Msg
}

// Validate returns every problem with c as it is: a zero field is a
// problem, not its default (see WithDefaults). show quotes a key's value
// in a message; nil is strconv.Quote. The config package passes one that
// quotes the file's text of a value taken from the environment, so that a
// secret never reaches an error.
func (c Config) Validate(show func(key, value string) string) []FieldError {
	if show == nil {
		show = func(_, v string) string { return strconv.Quote(v) }
	}
	var errs []FieldError
	add := func(key, format string, args ...any) {
		errs = append(errs, FieldError{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	switch msg := checkURL(c.URL); {
	case msg == "":
	case c.URL == "":
		add("url", "%s", msg)
	default:
		add("url", "%s, not %s", msg, show("url", c.URL))
	}
	if c.Token == "" {
		add("token", `is required (the daemon answers 401 without it): set token = "${EDGE_TOKEN}" or token_file`)
	} else if msg := CheckToken(c.Token); msg != "" {
		add("token", "the token %s", msg)
	}
	if msg := checkDeviceID(c.DeviceID); msg != "" {
		add("device_id", "%s", msg)
	}
	if c.Outbox == "" {
		add("outbox", "must not be empty")
	}
	if c.MaxEnvelopeBytes < minEnvelopeBytes || c.MaxEnvelopeBytes > devicewire.MaxEnvelopeBytes {
		add("max_envelope_bytes", "must be between %d and %d, not %d", minEnvelopeBytes, devicewire.MaxEnvelopeBytes, c.MaxEnvelopeBytes)
	}
	switch lo := max(int64(c.MaxEnvelopeBytes), minEnvelopeBytes); {
	case c.MaxOutboxBytes < lo:
		add("max_outbox_bytes", "must be at least %d, not %d", lo, c.MaxOutboxBytes)
	case c.MaxOutboxBytes > maxOutboxBytes:
		add("max_outbox_bytes", "must be at most %d, not %d", int64(maxOutboxBytes), c.MaxOutboxBytes)
	}
	if c.Window < 1 || c.Window > maxWindow {
		add("window", "must be between 1 and %d, not %d", maxWindow, c.Window)
	}
	if c.HTTPAddr != "" {
		if msg := checkHTTPAddr(c.HTTPAddr, show("http", c.HTTPAddr)); msg != "" {
			add("http", "%s", msg)
		}
	}
	if c.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddr); err != nil {
			add("metrics", `must be host:port such as "127.0.0.1:9466", not %s`, show("metrics", c.MetricsAddr))
		}
	}
	if c.HTTPAddr == "" && c.Socket == "" && !c.Stdin {
		add("", "no input: set http, socket or stdin = true")
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"ack_timeout", c.AckTimeout}, {"reconnect_base", c.ReconnectBase}, {"reconnect_max", c.ReconnectMax}} {
		if d.v <= 0 {
			add(d.key, "must be positive, not %v", d.v)
		}
	}
	if c.ReconnectMax < c.ReconnectBase {
		add("reconnect_max", "%v is less than reconnect_base %v", c.ReconnectMax, c.ReconnectBase)
	}
	return errs
}

// checkURL returns what is wrong with a daemon URL, or "".
func checkURL(s string) string {
	if s == "" {
		return `is required, e.g. "ws://127.0.0.1:9465/ingest/NAME/ws"`
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
		return `must be a ws:// or wss:// URL such as "wss://ingest.example.com:9465/ingest/NAME/ws"`
	}
	return ""
}

// CheckToken returns what is wrong with a bearer token, or "". Messages
// never quote the token.
func CheckToken(token string) string {
	for i := range len(token) {
		if c := token[i]; c <= ' ' || c > '~' {
			return "must be printable ASCII without spaces (it is sent in an HTTP header)"
		}
	}
	return ""
}

// checkDeviceID returns what is wrong with a device id, or "".
func checkDeviceID(id string) string {
	switch {
	case id == "":
		return "is required: it fills the device_id of every event that has none"
	case len(id) > devicewire.MaxIDBytes:
		return fmt.Sprintf("is %d bytes long, over the limit of %d", len(id), devicewire.MaxIDBytes)
	}
	return ""
}

// checkHTTPAddr returns what is wrong with the address of the HTTP input,
// shown in a message as quoted, or "". It has no authentication, so it
// must be loopback.
func checkHTTPAddr(addr, quoted string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Sprintf("must be a loopback host:port such as \"127.0.0.1:9470\", not %s", quoted)
	}
	if ip := net.ParseIP(host); !strings.EqualFold(host, "localhost") && (ip == nil || !ip.IsLoopback()) {
		return fmt.Sprintf("must be a loopback address such as \"127.0.0.1:9470\", not %s: the HTTP input has no authentication "+
			"(use a Unix socket, whose mode is 0600, to take events from other users' processes)", quoted)
	}
	return ""
}
