package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// connStates follows an http.Server's connections (its ConnState hook),
// to tell a shutdown cut short by requests under way from one held up by
// connections that never sent a request: net/http's Shutdown counts a
// new connection as busy for its first 5 seconds.
type connStates struct {
	mu     sync.Mutex
	active map[net.Conn]bool // the connections handling a request
}

// trackConns installs a connStates on srv, before it serves.
func trackConns(srv *http.Server) *connStates {
	c := &connStates{active: make(map[net.Conn]bool)}
	srv.ConnState = c.track
	return c
}

func (c *connStates) track(conn net.Conn, s http.ConnState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s == http.StateActive {
		c.active[conn] = true
	} else {
		delete(c.active, conn)
	}
}

// busy returns how many connections are handling a request.
func (c *connStates) busy() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.active)
}

// stopServer shuts srv down, waiting up to d for the requests under way,
// then closes every connection left. It fails only when requests were
// still running then: connections that sent nothing (a TCP health check,
// a client's spare keep-alive connection) are closed without an error.
func stopServer(srv *http.Server, conns *connStates, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	err := srv.Shutdown(ctx)
	if err == nil {
		return nil
	}
	busy := conns.busy()
	cerr := srv.Close()
	if busy == 0 && errors.Is(err, context.DeadlineExceeded) {
		return cerr
	}
	return errors.Join(fmt.Errorf("%w (%d requests still running were cut)", err, busy), cerr)
}
