package config

import (
	"crypto/tls"
	"net"
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
}

// pushTOML is [push] as written in the file.
type pushTOML struct {
	Addr        string `toml:"addr"`
	TLSCertFile string `toml:"tls_cert_file"`
	TLSKeyFile  string `toml:"tls_key_file"`
}

func (d *decoder) push(top map[string]toml.Primitive) Push {
	t := pushTOML{Addr: "127.0.0.1:9465"}
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
	case t.TLSCertFile != "":
		if _, err := tls.LoadX509KeyPair(t.TLSCertFile, t.TLSKeyFile); err != nil {
			d.errAt(child(p, "tls_cert_file"), "cannot load the certificate and key: %v", err)
		}
	}
	return Push{Addr: t.Addr, TLSCertFile: t.TLSCertFile, TLSKeyFile: t.TLSKeyFile}
}

// checkPush runs when an enabled source is a push kind: push.addr must
// not be taken by another listener, and beyond loopback every enabled push
// source must authenticate its senders.
func (d *decoder) checkPush(push Push, dm Daemon, srcs []Source) {
	if !PushEnabled(srcs) {
		return
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
		d.errAt([]string{"source", s.Name, "kind"}, "a %s source on push.addr %q, which is not loopback, must authenticate its senders: set a token or a signature", s.Kind, push.Addr)
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
