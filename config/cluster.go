package config

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"time"

	"github.com/BurntSushi/toml"
)

// Cluster is [cluster]: several daemons sharing the polled sources through
// etcd. Off by default; a daemon without it runs every enabled source
// itself and never contacts etcd.
type Cluster struct {
	// Enabled turns cluster mode on. Default false.
	Enabled bool
	// Name is the cluster's name: every key the members write is under
	// /ingestor/<Name>/. Default "ingestor".
	Name string
	// EtcdEndpoints are the etcd client URLs, http:// on loopback only,
	// https:// elsewhere. Required when Enabled.
	EtcdEndpoints []string
	// EtcdCAFile is a PEM bundle of the CAs the etcd servers' certificates
	// are verified against; empty uses the system's roots.
	EtcdCAFile string
	// EtcdCertFile and EtcdKeyFile, both or neither, are the client
	// certificate presented to etcd.
	EtcdCertFile string
	EtcdKeyFile  string
	// EtcdUsername and EtcdPassword authenticate to etcd; the password is
	// set inline (from ${ENV}) or read from EtcdPasswordFile.
	EtcdUsername string
	EtcdPassword string
	// MemberName names this daemon in the cluster; unique among members.
	// Default "": the host name (Member).
	MemberName string
	// AdvertiseHost is the host processors reach this member's publish
	// endpoints at, when they bind a wildcard address (tcp://0.0.0.0:...
	// or tcp://*:...). Default "": the endpoint's own host.
	AdvertiseHost string
	// LeaseTTL is the etcd lease of this member: a member silent for this
	// long (crashed, partitioned, paused) loses its sources to the others,
	// and stops polling them itself before the lease can expire. Default
	// 10s; at least 2s.
	LeaseTTL time.Duration
	// CheckpointInterval is how often this member writes the settled
	// cursors of the sources it holds to etcd, all in one transaction
	// (MaxTxnOps sources per transaction). Default 1s; at least 1s.
	CheckpointInterval time.Duration
	// RebalanceDelay is how long the sources of a member that went away
	// (stopped, restarted, crashed) wait for it to come back before they
	// are placed on the others: a rolling restart moves nothing. 0 moves
	// them as soon as its lease is gone. Default 30s.
	RebalanceDelay time.Duration
	// CompactInterval is how often the member holding the cluster's
	// compaction key compacts etcd's history, to the revision it saw one
	// interval before (as kube-apiserver does). 0 leaves compaction to
	// etcd's own --auto-compaction-*. Default 5m; from 10s to 24h.
	CompactInterval time.Duration
	// MaxTxnOps is the most operations one etcd transaction may hold:
	// etcd's --max-txn-ops (default 128). A checkpoint of more sources is
	// split into transactions of this many. Default 128.
	MaxTxnOps int
}

// clusterTOML is [cluster] as written in the file.
type clusterTOML struct {
	Enabled            bool     `toml:"enabled"`
	Name               string   `toml:"name"`
	EtcdEndpoints      []string `toml:"etcd_endpoints"`
	EtcdCAFile         string   `toml:"etcd_ca_file"`
	EtcdCertFile       string   `toml:"etcd_cert_file"`
	EtcdKeyFile        string   `toml:"etcd_key_file"`
	EtcdUsername       string   `toml:"etcd_username"`
	EtcdPassword       string   `toml:"etcd_password"`
	EtcdPasswordFile   string   `toml:"etcd_password_file"`
	MemberName         string   `toml:"member_name"`
	AdvertiseHost      string   `toml:"advertise_host"`
	LeaseTTL           duration `toml:"lease_ttl"`
	CheckpointInterval duration `toml:"checkpoint_interval"`
	RebalanceDelay     duration `toml:"rebalance_delay"`
	CompactInterval    duration `toml:"compact_interval"`
	MaxTxnOps          int64    `toml:"max_txn_ops"`
}

// clusterName is what a cluster or member name may hold: it becomes a
// path component of etcd keys.
var clusterName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// clusterDefaults is [cluster] with its defaults.
func clusterDefaults() clusterTOML {
	return clusterTOML{Name: "ingestor", LeaseTTL: "10s", CheckpointInterval: "1s", RebalanceDelay: "30s", CompactInterval: "5m", MaxTxnOps: 128}
}

// cluster decodes and checks [cluster] without contacting etcd: what
// can be known from the file (URLs, files that must exist, names).
func (d *decoder) cluster(top map[string]toml.Primitive) Cluster {
	t := clusterDefaults()
	d.section(top, "cluster", &t)
	p := []string{"cluster"}
	c := Cluster{Enabled: t.Enabled, Name: t.Name, EtcdEndpoints: t.EtcdEndpoints, EtcdCAFile: t.EtcdCAFile,
		EtcdCertFile: t.EtcdCertFile, EtcdKeyFile: t.EtcdKeyFile, EtcdUsername: t.EtcdUsername,
		MemberName: t.MemberName, AdvertiseHost: t.AdvertiseHost,
		LeaseTTL:           d.duration(child(p, "lease_ttl"), t.LeaseTTL, 10*time.Second),
		CheckpointInterval: d.duration(child(p, "checkpoint_interval"), t.CheckpointInterval, time.Second),
		RebalanceDelay:     d.durationOrOff(child(p, "rebalance_delay"), t.RebalanceDelay, 30*time.Second, 0, time.Hour),
		CompactInterval:    d.durationOrOff(child(p, "compact_interval"), t.CompactInterval, 5*time.Minute, 10*time.Second, 24*time.Hour),
		MaxTxnOps:          int(t.MaxTxnOps)}
	if !d.intRange(child(p, "max_txn_ops"), t.MaxTxnOps, 4, 1<<20) {
		c.MaxTxnOps = 128
	}
	c.EtcdPassword = d.token(child(p, "etcd_password"), child(p, "etcd_password_file"), t.EtcdPassword, t.EtcdPasswordFile,
		"etcd password", func(string) string { return "" })
	if !c.Enabled {
		return c
	}
	if !clusterName.MatchString(c.Name) {
		d.errAt(child(p, "name"), "must be 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit, not %s", d.show(child(p, "name"), c.Name))
	}
	if c.MemberName != "" && !clusterName.MatchString(c.MemberName) {
		d.errAt(child(p, "member_name"), "must be 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit, not %s",
			d.show(child(p, "member_name"), c.MemberName))
	}
	if c.LeaseTTL < 2*time.Second {
		d.errAt(child(p, "lease_ttl"), "must be at least 2s (etcd grants leases in whole seconds), not %s", d.show(child(p, "lease_ttl"), string(t.LeaseTTL)))
	}
	if c.CheckpointInterval < time.Second {
		d.errAt(child(p, "checkpoint_interval"), "must be at least 1s (etcd checkpoints are one transaction per member per interval), not %s",
			d.show(child(p, "checkpoint_interval"), string(t.CheckpointInterval)))
	}
	d.checkEtcdEndpoints(child(p, "etcd_endpoints"), c.EtcdEndpoints)
	switch {
	case c.EtcdCertFile != "" && c.EtcdKeyFile == "":
		d.errAt(child(p, "etcd_cert_file"), "needs cluster.etcd_key_file too: set both or neither")
	case c.EtcdKeyFile != "" && c.EtcdCertFile == "":
		d.errAt(child(p, "etcd_key_file"), "needs cluster.etcd_cert_file too: set both or neither")
	case c.EtcdCertFile != "" && d.readsKeyPair(child(p, "etcd_cert_file"), c.EtcdCertFile, child(p, "etcd_key_file"), c.EtcdKeyFile):
		if _, err := tls.LoadX509KeyPair(c.EtcdCertFile, c.EtcdKeyFile); err != nil {
			d.errAt(child(p, "etcd_cert_file"), "cannot load the certificate and key: %v", err)
		}
	}
	if c.EtcdCAFile != "" && d.readsFile(child(p, "etcd_ca_file"), c.EtcdCAFile) {
		if _, err := LoadClientCAs(c.EtcdCAFile); err != nil {
			d.errAt(child(p, "etcd_ca_file"), "%v", err)
		}
	}
	switch {
	case c.EtcdUsername != "" && c.EtcdPassword == "" && t.EtcdPasswordFile == "":
		d.errAt(child(p, "etcd_username"), "needs cluster.etcd_password or cluster.etcd_password_file")
	case c.EtcdUsername == "" && c.EtcdPassword != "":
		d.errAt(child(p, "etcd_password"), "needs cluster.etcd_username")
	}
	if h := c.AdvertiseHost; h != "" {
		if _, _, err := net.SplitHostPort(h); err == nil || h == "0.0.0.0" || h == "::" || h == "*" {
			d.errAt(child(p, "advertise_host"), "must be a host name or address that processors can reach, without a port, not %s", d.show(child(p, "advertise_host"), h))
		}
	}
	return c
}

// durationOrOff parses v at path: "0s" (off) or a duration from lo to hi;
// it reports anything else and returns def.
func (d *decoder) durationOrOff(path []string, v duration, def, lo, hi time.Duration) time.Duration {
	if d.covered(path) {
		return def
	}
	dur, err := time.ParseDuration(string(v))
	switch {
	case err != nil:
		d.errAt(path, `must be a duration such as "30s" or "5m", or "0s" for off, not %s`, d.show(path, string(v)))
	case dur != 0 && (dur < lo || dur > hi):
		d.errAt(path, "must be \"0s\" (off) or from %v to %v, not %s", lo, hi, d.show(path, string(v)))
	default:
		return dur
	}
	return def
}

// checkEtcdEndpoints reports endpoints that are not http(s)://host:port
// URLs, and plain http:// beyond loopback: cursors and ownership would
// travel unencrypted and unauthenticated.
func (d *decoder) checkEtcdEndpoints(p []string, eps []string) {
	if len(eps) == 0 {
		d.errAt(p, `is required with cluster.enabled: the etcd client URLs, e.g. ["https://etcd-0.example:2379"]`)
		return
	}
	for _, ep := range eps {
		u, err := url.Parse(ep)
		switch {
		case err != nil || u.Host == "" || u.Path != "" && u.Path != "/" || u.User != nil:
			d.errAt(p, "%q is not an etcd client URL such as https://etcd-0.example:2379", ep)
			return
		case u.Scheme != "http" && u.Scheme != "https":
			d.errAt(p, "%q: the scheme must be http or https", ep)
			return
		case u.Port() == "":
			d.errAt(p, "%q lacks a port (etcd's client port is usually 2379)", ep)
			return
		case u.Scheme == "http" && !LoopbackAddr(u.Host):
			d.errAt(p, "%q is plain http beyond loopback: use https:// (with cluster.etcd_ca_file for a private CA) so cursors and ownership travel encrypted", ep)
			return
		}
	}
}

// Member returns the member name: MemberName, or the host name when it is
// empty. The host name must then be a valid member name too.
func (c Cluster) Member() (string, error) {
	if c.MemberName != "" {
		return c.MemberName, nil
	}
	host, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("cluster.member_name is not set and the host name is unknown: %w", err)
	}
	if !clusterName.MatchString(host) {
		return "", fmt.Errorf("cluster.member_name is not set and the host name %q is not a valid member name: set member_name", host)
	}
	return host, nil
}
