package sources

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/ingestorhq/ingestor/internal/devicewire"
)

// WSIngressSpec configures kind "ws_ingress": devices connect to
// /ingest/NAME/ws on the push listener and send envelopes, each
// acknowledged only once it is durable. The wire protocol is in
// PROTOCOL.md, "Device ingress (ws_ingress)" (internal/devicewire).
type WSIngressSpec struct {
	PushGuard
	// MaxMessageBytes caps one envelope; a larger message is answered
	// "rejected". Default 1 MiB (devicewire.DefaultMaxEnvelopeBytes).
	MaxMessageBytes int64 `toml:"max_message_bytes"`
	// Token is a bearer token shared by every device (typically
	// "${ENV_NAME}"): a device presenting it may send envelopes of any
	// device_id. Never logged.
	Token string `toml:"token"`
	// TokensFile names a file of per-device tokens, one "DEVICE_ID TOKEN"
	// a line ('#' starts a comment). A device presenting its token may only
	// send envelopes whose device_id is DEVICE_ID. It is read when the
	// config is loaded and when the daemon starts.
	TokensFile string `toml:"tokens_file"`
	// MaxInflight is how many envelopes of one connection may wait for
	// their commit at once; at that many, the connection is not read until
	// one is answered (backpressure). An envelope answered "retry" keeps
	// its place until its retry_after_ms has passed. Default 64
	// (devicewire.DefaultWindow).
	MaxInflight int `toml:"max_inflight"`
	// ReadTimeout is how long a connection may stay silent (no message and
	// no pong) while the daemon waits for it before it is dropped; it also
	// bounds the write of one answer. Default "60s".
	ReadTimeout string `toml:"read_timeout"`
	// PingInterval is how often the daemon pings each connection; shorter
	// than ReadTimeout. Default "20s".
	PingInterval string `toml:"ping_interval"`
	// MaxConnections caps the connections open at once; beyond it a
	// handshake is answered 503 with Retry-After. Default 10000.
	MaxConnections int `toml:"max_connections"`
	// SeqGapGrace is how long a device's seq may stay missing (an
	// envelope of a higher seq was stored, this one not) before it is
	// reported lost: envelopes in flight may be stored out of order.
	// Default "1m"; "0s" reports a gap at once.
	SeqGapGrace string `toml:"seq_gap_grace"`
	// DeviceRetention is how long a device may store nothing before the
	// daemon forgets its seq tracking (its row in the queue database); one
	// that comes back starts again as a new device. "0" keeps every
	// device's row for good. Default "720h" (30 days); longer than
	// SeqGapGrace.
	DeviceRetention string `toml:"device_retention"`
}

func newWSIngressSpec() *WSIngressSpec {
	return &WSIngressSpec{MaxMessageBytes: devicewire.DefaultMaxEnvelopeBytes, MaxInflight: devicewire.DefaultWindow,
		ReadTimeout: "60s", PingInterval: "20s", MaxConnections: 10_000, SeqGapGrace: "1m", DeviceRetention: "720h"}
}

// DeviceKeep returns DeviceRetention parsed: 0 keeps every device (30 days
// if it does not parse: Validate refuses that).
func (s *WSIngressSpec) DeviceKeep() time.Duration {
	if strings.TrimSpace(s.DeviceRetention) == "0" {
		return 0
	}
	d, err := time.ParseDuration(s.DeviceRetention)
	if err != nil {
		return 30 * 24 * time.Hour
	}
	return d
}

// maxSeqGapGrace bounds seq_gap_grace.
const maxSeqGapGrace = 24 * time.Hour

// SeqGrace returns SeqGapGrace parsed (1 minute if it does not parse:
// Validate refuses that).
func (s *WSIngressSpec) SeqGrace() time.Duration {
	d, err := time.ParseDuration(s.SeqGapGrace)
	if err != nil {
		return time.Minute
	}
	return d
}

// Validate implements Spec.
func (s *WSIngressSpec) Validate() []FieldError {
	errs, _ := s.validate(false)
	return errs
}

// ValidateOffline implements OfflineSpec: tokens_file is not read.
func (s *WSIngressSpec) ValidateOffline() ([]FieldError, []string) { return s.validate(true) }

func (s *WSIngressSpec) validate(offline bool) ([]FieldError, []string) {
	var unread []string
	errs := s.PushGuard.Validate()
	if s.MaxMessageBytes < 1 || s.MaxMessageBytes > devicewire.MaxEnvelopeBytes {
		errs = append(errs, FieldError{"max_message_bytes", fmt.Sprintf("must be between 1 and %d (64 MiB)", devicewire.MaxEnvelopeBytes)})
	}
	if s.Token != "" {
		if msg := CheckToken(s.Token); msg != "" {
			errs = append(errs, FieldError{"token", "the token " + msg})
		}
	}
	if s.TokensFile != "" && offline {
		unread = append(unread, "tokens_file")
	} else if s.TokensFile != "" {
		if _, err := ReadDeviceTokens(s.TokensFile); err != nil {
			errs = append(errs, FieldError{"tokens_file", err.Error()})
		}
	}
	if s.MaxInflight < 1 || s.MaxInflight > 4096 {
		errs = append(errs, FieldError{"max_inflight", "must be between 1 and 4096"})
	}
	if s.MaxConnections < 1 || s.MaxConnections > 1_000_000 {
		errs = append(errs, FieldError{"max_connections", "must be between 1 and 1000000"})
	}
	grace, err := time.ParseDuration(s.SeqGapGrace)
	if err != nil || grace < 0 || grace > maxSeqGapGrace {
		errs = append(errs, FieldError{"seq_gap_grace", fmt.Sprintf("must be a duration from \"0s\" to \"24h\", such as \"1m\", not %q", s.SeqGapGrace)})
	}
	if strings.TrimSpace(s.DeviceRetention) != "0" {
		if d, err := time.ParseDuration(s.DeviceRetention); err != nil || d <= grace {
			errs = append(errs, FieldError{"device_retention", fmt.Sprintf("must be \"0\" (keep every device) or a duration longer than seq_gap_grace (%s), such as \"720h\", not %q",
				s.SeqGapGrace, s.DeviceRetention)})
		}
	}
	ping, pingOK := positiveDuration(&errs, "ping_interval", s.PingInterval)
	read, readOK := positiveDuration(&errs, "read_timeout", s.ReadTimeout)
	if pingOK && readOK && ping >= read {
		errs = append(errs, FieldError{"ping_interval", fmt.Sprintf("must be shorter than read_timeout (%s), or a quiet device that answers every ping is dropped", s.ReadTimeout)})
	}
	return errs, unread
}

// ReadDeviceTokens reads a tokens_file: one "DEVICE_ID TOKEN" a line,
// blank lines and lines starting with '#' ignored. It returns the device id
// of each token. Device ids and tokens must be unique; errors name the line
// but never quote a token.
func ReadDeviceTokens(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the device tokens: %w", err)
	}
	byToken := make(map[string]string)
	devices := make(map[string]int)
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return nil, fmt.Errorf("%s:%d: want \"DEVICE_ID TOKEN\", found %d fields", path, n, len(fields))
		}
		device, token := fields[0], fields[1]
		if len(device) > devicewire.MaxIDBytes {
			return nil, fmt.Errorf("%s:%d: the device id is longer than %d bytes", path, n, devicewire.MaxIDBytes)
		}
		if msg := CheckToken(token); msg != "" {
			return nil, fmt.Errorf("%s:%d: the token of device %q %s", path, n, device, msg)
		}
		if prev, ok := devices[device]; ok {
			return nil, fmt.Errorf("%s:%d: device %q already has a token on line %d", path, n, device, prev)
		}
		if other, ok := byToken[token]; ok {
			return nil, fmt.Errorf("%s:%d: device %q has the same token as device %q: each device needs its own", path, n, device, other)
		}
		devices[device] = n
		byToken[token] = device
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read the device tokens from %s: %w", path, err)
	}
	if len(byToken) == 0 {
		return nil, fmt.Errorf("%s holds no \"DEVICE_ID TOKEN\" line", path)
	}
	return byToken, nil
}

// Open implements Spec: a ws_ingress source has nothing to fetch.
func (s *WSIngressSpec) Open(env Env) (Source, error) {
	if errs := s.Validate(); len(errs) > 0 {
		return nil, specErrors(env.Name, "ws_ingress", errs)
	}
	return pushSource{name: env.Name, kind: "ws_ingress"}, nil
}

// Authenticated implements PushSpec: every handshake must present the
// shared token, a device's token, or a verified client certificate
// (require_client_cert; any certificate the CA signed may then send for
// any device_id).
func (s *WSIngressSpec) Authenticated() bool {
	return s.Token != "" || s.TokensFile != "" || s.RequireClientCert
}
