package config

import (
	_ "embed" // EdgeExampleTOML
	"fmt"
	"maps"
	"os"
	"slices"

	"github.com/ingestorhq/ingestor/internal/edge/edgeconfig"
)

// EdgeExampleTOML is edge.example.toml: the file of `ingestor edge -c`,
// every key documented with its default.
//
//go:embed edge.example.toml
var EdgeExampleTOML string

// Edge is the [edge] table of the edge forwarder's own config file (not
// the daemon's): what `ingestor edge -c FILE` runs with.
type Edge struct {
	// File is the path the config was loaded from.
	File string
	// Config holds the table's keys, with token_file read into Token.
	edgeconfig.Config
	// Telemetry is the file's [telemetry] table: the forwarder's tracing,
	// as the daemon's (off by default).
	Telemetry Telemetry
}

// edgeDurations are the duration keys of [edge] as written, parsed by the
// decoder so that a bad one is reported at its line as in the daemon's
// file. Listed first among the decode targets, they take these keys from
// edgeconfig.Config.
type edgeDurations struct {
	AckTimeout    duration `toml:"ack_timeout"`
	ReconnectBase duration `toml:"reconnect_base"`
	ReconnectMax  duration `toml:"reconnect_max"`
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
// validation (edgeconfig.Config.Validate), every problem returned at once
// as Errors, as ParseWithEnv does for the daemon's file. The file has the
// table [edge] and, optionally, [telemetry] (as the daemon's).
func ParseEdgeWithEnv(file string, data []byte, lookup func(string) (string, bool)) (*Edge, error) {
	d, top, err := newDecoder([]File{{Name: file, Data: data}}, Options{Lookup: lookup})
	if err != nil {
		return nil, err
	}
	for _, k := range slices.Sorted(maps.Keys(top)) {
		if k != "edge" && k != "telemetry" {
			d.unknown([]string{k})
		}
	}
	c := edgeconfig.Default()
	durs := edgeDurations{AckTimeout: duration(c.AckTimeout.String()), ReconnectBase: duration(c.ReconnectBase.String()),
		ReconnectMax: duration(c.ReconnectMax.String())}
	p := []string{"edge"}
	if _, ok := top["edge"]; !ok {
		d.errAt(p, "the file needs an [edge] table with at least url, token or token_file, and device_id")
	}
	d.section(top, "edge", &durs, &c)
	// at is the path of key; "" is the table itself.
	at := func(key string) []string {
		if key == "" {
			return p
		}
		return child(p, key)
	}
	c.AckTimeout = d.duration(at("ack_timeout"), durs.AckTimeout, c.AckTimeout)
	c.ReconnectBase = d.duration(at("reconnect_base"), durs.ReconnectBase, c.ReconnectBase)
	c.ReconnectMax = d.duration(at("reconnect_max"), durs.ReconnectMax, c.ReconnectMax)
	c.Token = d.token(at("token"), at("token_file"), c.Token, c.TokenFile, "token", edgeconfig.CheckToken)
	// A key that already has an error keeps that one, and so does a token
	// whose token_file has one. Which ones is decided before any problem
	// is reported, so that one about the table (no input) hides none
	// about its keys.
	show := func(key, v string) string { return d.show(at(key), v) }
	problems := slices.DeleteFunc(c.Validate(show), func(fe edgeconfig.FieldError) bool {
		return d.covered(at(fe.Key)) || fe.Key == "token" && d.covered(at("token_file"))
	})
	for _, fe := range problems {
		d.errAt(at(fe.Key), "%s", fe.Msg)
	}
	tel := d.telemetry(top)
	d.undecoded()
	if err := d.result(); err != nil {
		return nil, err
	}
	return &Edge{File: file, Config: c, Telemetry: tel}, nil
}
