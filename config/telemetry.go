package config

import (
	"fmt"
	"net/url"
	"time"

	"github.com/BurntSushi/toml"
)

// Telemetry is the [telemetry] section: OpenTelemetry tracing, exported
// over OTLP. Tracing is off while Endpoint is empty (the default), and then
// costs nothing on the event path.
type Telemetry struct {
	// Endpoint is the OTLP receiver's URL: http://HOST:PORT for plaintext,
	// https://HOST:PORT for TLS. For protocol "http/protobuf" a path may
	// follow (default /v1/traces); for "grpc" it may not.
	Endpoint string
	// Protocol is "grpc" (default, port 4317 by convention) or
	// "http/protobuf" (4318).
	Protocol string
	// CAFile verifies an https endpoint with this CA instead of the
	// system's; CertFile and KeyFile, set together, are a client
	// certificate. They are read when the daemon starts.
	CAFile, CertFile, KeyFile string
	// Headers are sent with every export (an API key, say): values may
	// hold ${ENV}. HeaderFiles maps a header name to a file holding its
	// value (surrounding whitespace trimmed), read when the daemon starts.
	Headers, HeaderFiles map[string]string
	// SamplingRatio is the share of new traces kept, from 0 to 1 (default
	// 1). A trace continued from a webhook's or a device's traceparent
	// follows the caller's decision instead.
	SamplingRatio float64
	// ServiceName is the service.name resource attribute ("ingestor").
	ServiceName string
	// ExportTimeout bounds one export (default 10s).
	ExportTimeout time.Duration
}

// Enabled reports whether tracing is on.
func (t Telemetry) Enabled() bool { return t.Endpoint != "" }

type telemetryTOML struct {
	Endpoint      string            `toml:"endpoint"`
	Protocol      string            `toml:"protocol"`
	CAFile        string            `toml:"ca_file"`
	CertFile      string            `toml:"cert_file"`
	KeyFile       string            `toml:"key_file"`
	Headers       map[string]string `toml:"headers"`
	HeaderFiles   map[string]string `toml:"header_files"`
	SamplingRatio float64           `toml:"sampling_ratio"`
	ServiceName   string            `toml:"service_name"`
	ExportTimeout duration          `toml:"export_timeout"`
}

// telemetryDefaults is [telemetry] before its keys are decoded.
func telemetryDefaults() telemetryTOML {
	return telemetryTOML{Protocol: "grpc", SamplingRatio: 1, ServiceName: "ingestor", ExportTimeout: "10s"}
}

func (d *decoder) telemetry(top map[string]toml.Primitive) Telemetry {
	t := telemetryDefaults()
	d.section(top, "telemetry", &t)
	p := []string{"telemetry"}
	c := Telemetry{Endpoint: t.Endpoint, Protocol: t.Protocol, CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile,
		Headers: t.Headers, HeaderFiles: t.HeaderFiles, SamplingRatio: t.SamplingRatio, ServiceName: t.ServiceName,
		ExportTimeout: d.duration(child(p, "export_timeout"), t.ExportTimeout, 10*time.Second)}
	d.oneOf(child(p, "protocol"), c.Protocol, "grpc", "http/protobuf")
	if c.SamplingRatio < 0 || c.SamplingRatio > 1 {
		d.errAt(child(p, "sampling_ratio"), "must be from 0 to 1, not %v", c.SamplingRatio)
	}
	if c.ServiceName == "" {
		d.errAt(child(p, "service_name"), "must not be empty")
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		d.errAt(child(p, "cert_file"), "telemetry.cert_file and telemetry.key_file go together: set both or neither")
	}
	for name := range c.HeaderFiles {
		if _, dup := c.Headers[name]; dup {
			d.errAt(child(p, "header_files"), "header %q is set in telemetry.headers too: set it in one place", name)
		}
	}
	if c.Endpoint != "" {
		if msg := checkOTLPEndpoint(c.Endpoint, c.Protocol); msg != "" {
			d.errAt(child(p, "endpoint"), "%s, not %s", msg, d.show(child(p, "endpoint"), c.Endpoint))
		}
	}
	return c
}

// checkOTLPEndpoint returns what is wrong with an OTLP endpoint URL, or "".
func checkOTLPEndpoint(endpoint, protocol string) string {
	u, err := url.Parse(endpoint)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return "must be a URL: http://HOST:PORT (plaintext) or https://HOST:PORT (TLS)"
	case u.User != nil:
		return "must not hold credentials: send them in telemetry.headers or telemetry.header_files"
	case protocol == "grpc" && u.Path != "" && u.Path != "/":
		return fmt.Sprintf("must have no path with protocol %q (the gRPC service has a fixed name)", protocol)
	}
	return ""
}
