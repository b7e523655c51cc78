package config

import (
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/ingestorhq/ingestor/sources"
)

// adminToken returns the admin token set by admin_token or read from
// admin_token_file (surrounding whitespace trimmed), reporting a problem at
// the key that has it. Messages never quote the token.
func (d *decoder) adminToken(p []string, token, file string) string {
	return d.token(child(p, "admin_token"), child(p, "admin_token_file"), token, file, "admin token", sources.CheckToken)
}

// token returns the secret set at tokenPath, or read from the file named
// at filePath (surrounding whitespace trimmed), checked by check (which
// returns what is wrong, or ""); what names the secret in messages. A
// problem is reported at the key that has it. Messages never quote the
// token.
func (d *decoder) token(tokenPath, filePath []string, token, file, what string, check func(string) string) string {
	switch {
	case token != "" && file != "":
		d.errAt(filePath, "set %s or %s, not both", toml.Key(tokenPath), toml.Key(filePath))
		return ""
	case file != "" && !d.readsFile(filePath, file):
		return ""
	case file != "":
		data, err := os.ReadFile(file)
		if err != nil {
			d.errAt(filePath, "read the %s: %v", what, err)
			return ""
		}
		token = strings.TrimSpace(string(data))
		if token == "" {
			d.errAt(filePath, "the file %s is empty", d.show(filePath, file))
			return ""
		}
		if msg := check(token); msg != "" {
			d.errAt(filePath, "the token in %s %s", d.show(filePath, file), msg)
			return ""
		}
	case token != "":
		if msg := check(token); msg != "" {
			d.errAt(tokenPath, "the token %s", msg)
			return ""
		}
	}
	return token
}

// checkAdminAddr returns what is wrong with a set admin_addr, or "".
func checkAdminAddr(addr string) string {
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		if path == "" {
			return `must be host:port or unix:PATH (the path is empty)`
		}
		return ""
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return `must be host:port such as "127.0.0.1:9463", or unix:PATH such as "unix:/run/ingestor/admin.sock"`
	}
	return ""
}

// AdminListenAddr returns the address the admin endpoints (/dlq) are
// served on: AdminAddr when set, else HTTPAddr.
func (d Daemon) AdminListenAddr() string {
	if d.AdminAddr != "" {
		return d.AdminAddr
	}
	return d.HTTPAddr
}

// AdminProblem returns why d may not serve its admin endpoints as
// configured, or "": without a token they must listen on loopback or a
// Unix socket. The daemon refuses to start on such a config, which
// validation already reports.
func (d Daemon) AdminProblem() string {
	addr := d.AdminListenAddr()
	if d.AdminToken != "" || addr == "" || strings.HasPrefix(addr, "unix:") || LoopbackAddr(addr) {
		return ""
	}
	msg := fmt.Sprintf("serves the admin endpoints (/dlq: read payloads, replay and drop dead letters) on %q, which is not loopback, "+
		"so they need a token: set daemon.admin_token (e.g. \"${INGESTOR_ADMIN_TOKEN}\") or daemon.admin_token_file", addr)
	if d.AdminAddr == "" {
		msg += `, or serve them on a private address with daemon.admin_addr (e.g. "127.0.0.1:9463" or "unix:/run/ingestor/admin.sock")`
	}
	return msg
}

// LoopbackAddr reports whether the host of addr (host:port) is a loopback
// address or "localhost". An empty host means every interface, so it is not.
func LoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
