package edgeconfig

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// valid returns a Config that passes Validate.
func valid() Config {
	c := Default()
	c.URL, c.Token, c.DeviceID, c.Stdin = "wss://ingest.example.com/ingest/devices/ws", "t0ken", "dev-1", true
	return c
}

// TestDefaults checks that the zero Config gets every default, that a
// set field keeps its value, and that the defaults pass Validate.
func TestDefaults(t *testing.T) {
	if got := (Config{}).WithDefaults(); got != Default() {
		t.Errorf("Config{}.WithDefaults() = %+v, want %+v", got, Default())
	}
	if got := (Config{Window: 3, AckTimeout: time.Second}).WithDefaults(); got.Window != 3 || got.AckTimeout != time.Second ||
		got.Outbox != DefaultOutbox {
		t.Errorf("WithDefaults changed a set field or missed a zero one: %+v", got)
	}
	c := valid()
	if errs := c.Validate(nil); len(errs) != 0 {
		t.Errorf("the defaults do not validate: %v", errs)
	}
}

// TestValidate checks every problem Validate finds, each at its key, and
// that a value is quoted by show.
func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want []string
	}{
		{"required", func(c *Config) { c.URL, c.Token, c.DeviceID = "", "", "" }, []string{
			`url: is required`, `token: is required (the daemon answers 401 without it)`, `device_id: is required`}},
		{"url", func(c *Config) { c.URL = "http://h/x" }, []string{`url: must be a ws:// or wss:// URL such as "wss://ingest.example.com:9465/ingest/NAME/ws", not <http://h/x>`}},
		{"token", func(c *Config) { c.Token = "a token" }, []string{`token: the token must be printable ASCII without spaces`}},
		{"long device id", func(c *Config) { c.DeviceID = strings.Repeat("d", 257) }, []string{`device_id: is 257 bytes long, over the limit of 256`}},
		{"sizes", func(c *Config) { c.Outbox, c.MaxEnvelopeBytes, c.MaxOutboxBytes, c.Window = "", 10, 1000, 0 }, []string{
			`outbox: must not be empty`, `max_envelope_bytes: must be between 1024 and 67108864, not 10`,
			`max_outbox_bytes: must be at least 1024, not 1000`, `window: must be between 1 and 10000, not 0`}},
		{"outbox under one envelope", func(c *Config) { c.MaxOutboxBytes = DefaultMaxEnvelopeBytes - 1 }, []string{
			`max_outbox_bytes: must be at least 1048576, not 1048575`}},
		{"addresses", func(c *Config) { c.HTTPAddr, c.MetricsAddr = "0.0.0.0:9470", "9466" }, []string{
			`http: must be a loopback address such as "127.0.0.1:9470", not <0.0.0.0:9470>`,
			`metrics: must be host:port such as "127.0.0.1:9466", not <9466>`}},
		{"no input", func(c *Config) { c.Stdin = false }, []string{`no input: set http, socket or stdin = true`}},
		{"durations", func(c *Config) {
			c.AckTimeout, c.ReconnectBase, c.ReconnectMax = -time.Second, time.Minute, time.Second
		}, []string{
			`ack_timeout: must be positive, not -1s`, `reconnect_max: 1s is less than reconnect_base 1m0s`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.edit(&c)
			var got []string
			for _, fe := range c.Validate(func(_, v string) string { return "<" + v + ">" }) {
				got = append(got, fe.Error())
			}
			if len(got) != len(tc.want) {
				t.Errorf("%d problems, want %d:\n%s", len(got), len(tc.want), strings.Join(got, "\n"))
			}
			for _, w := range tc.want {
				if !slices.ContainsFunc(got, func(g string) bool { return strings.HasPrefix(g, w) }) {
					t.Errorf("missing %q in:\n%s", w, strings.Join(got, "\n"))
				}
			}
		})
	}
}
