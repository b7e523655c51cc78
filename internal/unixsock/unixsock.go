// Package unixsock listens on a Unix socket that only the process's user
// may connect to (mode 0600), for the daemon's admin endpoints and the
// edge forwarder's local input. A socket file left by a process that died
// is replaced; one that answers is in use, and refused.
package unixsock

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

// Listen listens on the Unix socket at path, mode 0600.
func Listen(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			return nil, errors.Join(fmt.Errorf("listen unix:%s: the socket is in use by another process", path), c.Close())
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("listen unix:%s: remove stale socket: %w", path, err)
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen unix:%s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		return nil, errors.Join(fmt.Errorf("listen unix:%s: %w", path, err), ln.Close())
	}
	return ln, nil
}
