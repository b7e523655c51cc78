// Package httpstop stops an http.Server without waiting for connections
// that never sent a request.
//
// net/http's Shutdown counts a connection that has sent nothing yet as
// busy for its first 5 seconds, so a TCP health check, a load balancer's
// probe or a client's spare keep-alive connection holds a stop up to 5 s,
// and fails it when the stop has less time than that. Shutdown here waits
// for the requests under way only, then closes what is left: a
// connection closed before its request was read loses nothing, since
// nothing was answered on it (its client sees the connection closed and
// tries again).
package httpstop

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// Conns follows an http.Server's connections (its ConnState hook) to
// know how many are handling a request.
type Conns struct {
	mu     sync.Mutex
	active map[net.Conn]bool // the connections handling a request
	idle   chan struct{}     // closed when active empties, while a stop waits
}

// Track installs a Conns on srv, before it serves; it replaces
// srv.ConnState.
func Track(srv *http.Server) *Conns {
	c := &Conns{active: make(map[net.Conn]bool)}
	srv.ConnState = c.track
	return c
}

func (c *Conns) track(conn net.Conn, s http.ConnState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s == http.StateActive {
		c.active[conn] = true
		return
	}
	delete(c.active, conn)
	if len(c.active) == 0 && c.idle != nil {
		close(c.idle)
		c.idle = nil
	}
}

// Busy returns how many connections are handling a request.
func (c *Conns) Busy() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.active)
}

// idleCh returns a channel closed once no connection handles a request.
func (c *Conns) idleCh() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan struct{})
	if len(c.active) == 0 {
		close(ch)
	} else {
		c.idle = ch
	}
	return ch
}

// Shutdown stops srv, whose connections c tracks: it stops accepting,
// waits until no request runs or ctx ends, then closes every connection
// left. It fails only when requests were still running as ctx ended.
func Shutdown(ctx context.Context, srv *http.Server, c *Conns) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- srv.Shutdown(sctx) }()
	var err error
	select {
	case err = <-stopped:
		if err == nil {
			return nil
		}
	case <-c.idleCh():
		// No request runs: what Shutdown still waits for are connections
		// that sent nothing, which it would count busy for 5 s.
		cancel()
		<-stopped
		return closeAll(srv)
	}
	busy := c.Busy()
	cerr := closeAll(srv)
	if busy == 0 && errors.Is(err, context.DeadlineExceeded) {
		return cerr
	}
	return errors.Join(fmt.Errorf("%w (%d requests still running were cut)", err, busy), cerr)
}

// closeAll closes srv's connections. Its listeners are closed already
// (Shutdown closes them first): closing one again is no failure.
func closeAll(srv *http.Server) error {
	if err := srv.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

// ShutdownWithin is Shutdown with a context that ends after d.
func ShutdownWithin(srv *http.Server, c *Conns, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return Shutdown(ctx, srv, c)
}
