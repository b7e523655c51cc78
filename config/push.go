package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/ingestorhq/ingestor/sources"
)

// Push is the push listener ([push]): the HTTP server that push sources
// (kind webhook and ws_ingress) are served on, apart from the ops and
// admin listeners. It runs only when an enabled source is a push kind.
type Push struct {
	// Addr is host:port. Default "127.0.0.1:9465". Beyond loopback, every
	// enabled push source must authenticate its senders (a token or a
	// signature).
	Addr string
	// TLSCertFile and TLSKeyFile, both or neither, serve HTTPS (and wss).
	TLSCertFile string
	TLSKeyFile  string
	// ClientCAFile is a PEM bundle of the CAs client certificates are
	// verified against; with it the listener (TLS only) asks every client
	// for a certificate and refuses a handshake with one it cannot verify.
	// A source with require_client_cert refuses requests without one.
	ClientCAFile string
}

// pushTOML is [push] as written in the file.
type pushTOML struct {
	Addr         string `toml:"addr"`
	TLSCertFile  string `toml:"tls_cert_file"`
	TLSKeyFile   string `toml:"tls_key_file"`
	ClientCAFile string `toml:"client_ca_file"`
}

// pushDefaults is [push] with its defaults.
func pushDefaults() pushTOML { return pushTOML{Addr: "127.0.0.1:9465"} }

func (d *decoder) push(top map[string]toml.Primitive) Push {
	t := pushDefaults()
	d.section(top, "push", &t)
	p := []string{"push"}
	if _, _, err := net.SplitHostPort(t.Addr); err != nil {
		d.errAt(child(p, "addr"), "must be host:port such as \"127.0.0.1:9465\" or \":9465\", not %s", d.show(child(p, "addr"), t.Addr))
	}
	switch {
	case t.TLSKeyFile == "" && t.TLSCertFile != "":
		d.errAt(child(p, "tls_cert_file"), "needs push.tls_key_file too: set both or neither")
	case t.TLSCertFile == "" && t.TLSKeyFile != "":
		d.errAt(child(p, "tls_key_file"), "needs push.tls_cert_file too: set both or neither")
	case t.TLSCertFile != "" && d.readsKeyPair(child(p, "tls_cert_file"), t.TLSCertFile, child(p, "tls_key_file"), t.TLSKeyFile):
		if _, err := tls.LoadX509KeyPair(t.TLSCertFile, t.TLSKeyFile); err != nil {
			d.errAt(child(p, "tls_cert_file"), "cannot load the certificate and key: %v", err)
		}
	}
	switch ca := child(p, "client_ca_file"); {
	case t.ClientCAFile == "":
	case t.TLSCertFile == "" || t.TLSKeyFile == "":
		d.errAt(ca, "needs push.tls_cert_file and push.tls_key_file: client certificates are only asked for over TLS")
	case d.readsFile(ca, t.ClientCAFile):
		if _, err := LoadClientCAs(t.ClientCAFile); err != nil {
			d.errAt(ca, "%v", err)
		}
	}
	return Push{Addr: t.Addr, TLSCertFile: t.TLSCertFile, TLSKeyFile: t.TLSKeyFile, ClientCAFile: t.ClientCAFile}
}

// LoadClientCAs reads push.client_ca_file, a PEM bundle of CA
// certificates.
func LoadClientCAs(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the client CAs: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}

// checkPush runs when an enabled source is a push kind: push.addr must
// not be taken by another listener, beyond loopback every enabled push
// source must authenticate its senders, and a source that requires client
// certificates needs push.client_ca_file.
func (d *decoder) checkPush(push Push, dm Daemon, srcs []Source) {
	if !PushEnabled(srcs) {
		return
	}
	if push.ClientCAFile == "" {
		for _, s := range srcs {
			if g, ok := s.Spec.(interface{ ClientCertRequired() bool }); ok && s.Enabled && g.ClientCertRequired() {
				d.errAt([]string{"source", s.Name, "require_client_cert"},
					"needs push.client_ca_file, the CA that client certificates are verified against (and TLS: push.tls_cert_file, push.tls_key_file)")
			}
		}
	}
	p := []string{"push", "addr"}
	if push.Addr == dm.HTTPAddr || push.Addr == dm.AdminAddr {
		if !strings.HasSuffix(push.Addr, ":0") {
			d.errAt(p, "must differ from daemon.http_addr and daemon.admin_addr")
		}
	}
	if LoopbackAddr(push.Addr) {
		return
	}
	for _, s := range srcs {
		ps, ok := s.Spec.(sources.PushSpec)
		if !ok || !s.Enabled || ps.Authenticated() {
			continue
		}
		d.errAt([]string{"source", s.Name, "kind"}, "a %s source on push.addr %q, which is not loopback, must authenticate its senders: set a token, a signature or require_client_cert", s.Kind, push.Addr)
	}
}

// PushEnabled reports whether an enabled source is a push kind, which
// needs the push listener.
func PushEnabled(srcs []Source) bool {
	for _, s := range srcs {
		if _, ok := s.Spec.(sources.PushSpec); ok && s.Enabled {
			return true
		}
	}
	return false
}
