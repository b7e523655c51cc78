package sources

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"
)

// streamCore is what the streaming kinds, websocket and sse, share: the
// HTTP client that opens the connection, a reader goroutine that owns the
// connection and fills a buffer of T (a message, an event), the state of
// that connection, and the Fetch side that drains the buffer or reports
// an outage. Each kind embeds it and keeps what differs: the handshake or
// request, the reader's loop, parsing, and assembling its batch.
type streamCore[T any] struct {
	// where starts every error: source "NAME": KIND URL, without the
	// query or user info, which may hold secrets.
	where string
	// medium names the connection in the outage error: "connection" or
	// "stream".
	medium string
	// readTimeout is how long the source may be down before Fetch says
	// so.
	readTimeout time.Duration
	// method and sent are the Method and URL of every trace event; sent
	// is the URL as traceURL shows it, and only the reader changes it.
	method, sent string
	trace        func(TraceEvent)
	// client makes the handshakes or requests over transport, its own;
	// auth, when set, gives each one an OAuth2 token. insecure is
	// tls_insecure_skip_verify, warned about on every connect.
	client    *http.Client
	transport *http.Transport
	auth      *oauth2Token
	insecure  bool

	// buf holds the items received and not yet handed out. Only the
	// reader sends to it; only Fetch receives from it.
	buf chan T
	// held is an item Fetch took from buf but could not hand out with
	// the batch it was building; the next Fetch starts with it. Only Fetch
	// uses it.
	held *T

	// mu guards the fields below, and the kind's own cursor.
	mu sync.Mutex
	// started and closed guard the reader's lifecycle; stop ends it and
	// done is closed when it has returned.
	started, closed bool
	stop            context.CancelFunc
	done            chan struct{}
	// up reports a connection in use (subscribed, or an open stream);
	// stopped that the upstream answered sse's 204, which is quiet, not
	// down. Otherwise downSince is when the source last had a connection
	// (or started) and lastErr why the last attempt failed; permanent
	// marks an attempt refused with a 4xx status.
	up, stopped bool
	downSince   time.Time
	lastErr     error
	permanent   bool
	// wait is set when the last attempt was answered with Retry-After:
	// no attempt goes out before wait.Until, and until then Fetch returns
	// wait when nothing is buffered.
	wait *WaitError
	// stateChanged is closed, and replaced, whenever up, stopped or wait
	// changes.
	stateChanged chan struct{}
}

// newStreamCore returns a streamCore buffering up to size items.
func newStreamCore[T any](where, medium, method string, size int, trace func(TraceEvent)) streamCore[T] {
	return streamCore[T]{
		where:        where,
		medium:       medium,
		method:       method,
		trace:        trace,
		buf:          make(chan T, size),
		done:         make(chan struct{}),
		stateChanged: make(chan struct{}),
	}
}

// openClient sets up the client of the handshakes or requests: its own
// transport with the TLS settings, redirects followed on the url's host
// only, and with spec an OAuth2 token source. Its errors are Open's, for
// source kind.
func (c *streamCore[T]) openClient(env Env, kind, caFile string, insecure bool, spec *OAuth2Spec, logger *slog.Logger) error {
	var err error
	c.transport = http.DefaultTransport.(*http.Transport).Clone()
	if c.transport.TLSClientConfig, err = clientTLSConfig(caFile, insecure, logger); err != nil {
		return fmt.Errorf("source %q: %s: %w", env.Name, kind, err)
	}
	c.insecure = insecure
	// No client timeout: the connection is held open; read_timeout bounds
	// the handshake and the wait for each message or byte instead.
	c.client = &http.Client{Transport: c.transport, CheckRedirect: sameHostRedirect}
	if spec != nil {
		if c.auth, err = openOAuth2(spec, env, c.transport, logger); err != nil {
			return fmt.Errorf("source %q: %s: %w", env.Name, kind, err)
		}
	}
	return nil
}

// sameHostRedirect follows up to 10 redirects on the same host: the
// headers carry credentials.
func sameHostRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	if req.URL.Host != via[0].URL.Host {
		return fmt.Errorf("redirect to %s refused: only the url's host is followed", redactURL(req.URL))
	}
	return nil
}

// start starts run as the reader goroutine on the first call. Before, with
// mu held, it calls note with whether this is the first call, so that the
// kind notes the caller's cursor as it sees fit.
func (c *streamCore[T]) start(note func(first bool), run func(context.Context)) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("%s: source is closed", c.where)
	}
	note(!c.started)
	if !c.started {
		c.started = true
		c.downSince = time.Now()
		ctx, cancel := context.WithCancel(context.Background())
		c.stop = cancel
		go run(ctx)
	}
	return nil
}

// streamIdleWait bounds how long a fetch waits for a first item. A quiet
// stream then costs one empty fetch a second, and a fetch in progress
// delays a drain (which waits for it) by a second at most.
const streamIdleWait = time.Second

// next returns the first item of a fetch: the held one or the next
// buffered one, waiting for it until ctx ends or streamIdleWait has passed
// (nil, nil) or the source has been down too long (an error).
func (c *streamCore[T]) next(ctx context.Context) (*T, error) {
	if it := c.held; it != nil {
		c.held = nil
		return it, nil
	}
	ctx, cancel := context.WithTimeout(ctx, streamIdleWait)
	defer cancel()
	for {
		select {
		case it := <-c.buf:
			return &it, nil
		default:
		}
		changed, deadline, err := c.downState()
		if err != nil {
			return nil, err
		}
		var expire <-chan time.Time
		var timer *time.Timer
		if !deadline.IsZero() {
			timer = time.NewTimer(time.Until(deadline))
			expire = timer.C
		}
		var it *T
		select {
		case got := <-c.buf:
			it = &got
		case <-ctx.Done():
		case <-changed:
		case <-expire:
		case <-c.done:
			err = fmt.Errorf("%s: source is closed", c.where)
		}
		if timer != nil {
			timer.Stop()
		}
		if it != nil || err != nil || ctx.Err() != nil {
			return it, err
		}
	}
}

// take returns first and the items buffered after it, up to limit in all.
// It stops before a bad one, which it holds for the next fetch, so that
// the good items are handed out first.
func (c *streamCore[T]) take(first *T, limit int, bad func(*T) bool) []*T {
	items := []*T{first}
	for len(items) < limit {
		select {
		case it := <-c.buf:
			if bad(&it) {
				c.held = &it
				return items
			}
			items = append(items, &it)
		default:
			return items // nothing more buffered
		}
	}
	return items
}

// more reports whether an item is held or buffered: the batch being
// handed out is not the last one ready.
func (c *streamCore[T]) more() bool {
	return c.held != nil || len(c.buf) > 0
}

// downState returns a channel closed when the connection state changes,
// and, while the source has no connection, when that outage will have
// lasted read_timeout, or the error to report when it already has or the
// upstream asked to wait. A source told 204 is quiet, not down.
func (c *streamCore[T]) downState() (<-chan struct{}, time.Time, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.up || c.stopped {
		return c.stateChanged, time.Time{}, nil
	}
	if c.wait != nil && time.Now().Before(c.wait.Until) {
		return nil, time.Time{}, c.wait
	}
	deadline := c.downSince.Add(c.readTimeout)
	if time.Now().Before(deadline) {
		return c.stateChanged, deadline, nil
	}
	cause := c.lastErr
	if cause == nil {
		cause = errors.New("still connecting")
	}
	err := fmt.Errorf("%s: no %s for %s: %w", c.where, c.medium, time.Since(c.downSince).Round(time.Millisecond), cause)
	if c.permanent {
		return nil, time.Time{}, &PermanentError{Err: err}
	}
	return nil, time.Time{}, err
}

// push buffers it, and reports false when ctx ended first. While the
// buffer is full it stops reading, which pushes back on the connection,
// and pauses the watchdog, since nothing (not even a pong) is read then.
func (c *streamCore[T]) push(ctx context.Context, it T, wd *watchdog) bool {
	select {
	case c.buf <- it:
		return true
	default:
	}
	wd.pause()
	select {
	case c.buf <- it:
		wd.resume()
		return true
	case <-ctx.Done():
		return false
	}
}

// Close implements Source: it stops the reader, which closes the
// connection (a websocket one with no close handshake), and waits for it.
func (c *streamCore[T]) Close() error {
	c.mu.Lock()
	c.closed = true
	stop, started := c.stop, c.started
	c.mu.Unlock()
	if started {
		stop()
		<-c.done
	}
	c.transport.CloseIdleConnections()
	return nil
}

// refuse records an attempt that failed with err and was answered with
// ev.Status (0 when nothing answered), having traced ev. A 4xx status
// other than 408 and 429 is permanent. A 429 or 503 with Retry-After sets
// the wait, as http_poll does: no attempt goes out before the time the
// upstream gave, and Fetch hands the wait to the caller, with an error
// saying what (as "handshake status") answered with the status.
func (c *streamCore[T]) refuse(ev TraceEvent, resp *http.Response, err error, what string) {
	status := ev.Status
	var wait *WaitError
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		now := time.Now()
		if until, ok := retryAfter(resp.Header.Get("Retry-After"), now); ok {
			ev.Note += "; Retry-After " + until.Sub(now).Round(time.Millisecond).String()
			wait = &WaitError{Until: until, Err: fmt.Errorf("%s: %s %d", c.where, what, status), Reason: WaitRetryAfter}
		}
	}
	c.traceEvent(ev)
	c.setDown(err, status >= 400 && status < 500 && status != http.StatusRequestTimeout && status != http.StatusTooManyRequests)
	if wait != nil {
		c.setWait(wait)
	}
}

// setUp records a connection in use.
func (c *streamCore[T]) setUp() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.up, c.stopped, c.lastErr, c.permanent, c.wait = true, false, nil, false, nil
	c.changed()
}

// setStopped records an sse 204: the source is quiet until the next try.
func (c *streamCore[T]) setStopped() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.up, c.stopped, c.lastErr, c.permanent, c.wait = false, true, nil, false, nil
	c.changed()
}

// setDown records a failed attempt or a lost connection.
func (c *streamCore[T]) setDown(err error, permanent bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lastErr, c.permanent = err, permanent
	if c.up || c.stopped {
		c.up, c.stopped, c.downSince = false, false, time.Now()
		c.changed()
	}
}

// setWait records an attempt answered with Retry-After, and wakes a Fetch
// waiting for the connection so that it returns wait at once.
func (c *streamCore[T]) setWait(wait *WaitError) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wait = wait
	c.changed()
}

// changed wakes whoever waits on stateChanged; c.mu is held.
func (c *streamCore[T]) changed() {
	close(c.stateChanged)
	c.stateChanged = make(chan struct{})
}

// retryAfter returns the time before which no attempt may go out: the
// last Retry-After, or zero.
func (c *streamCore[T]) retryAfter() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.wait == nil {
		return time.Time{}
	}
	return c.wait.Until
}

// traceEvent reports a connection event to Env.Trace, if set.
func (c *streamCore[T]) traceEvent(ev TraceEvent) {
	if c.trace != nil {
		ev.Method, ev.URL = c.method, c.sent
		c.trace(ev)
	}
}

// kickReader calls kick whenever bytes arrive.
type kickReader struct {
	r    io.Reader
	kick func()
}

func (k kickReader) Read(p []byte) (int, error) {
	n, err := k.r.Read(p)
	if n > 0 {
		k.kick()
	}
	return n, err
}

// watchdog calls its fire function when it has not been kicked for d while
// armed and not paused.
type watchdog struct {
	d time.Duration

	mu     sync.Mutex
	timer  *time.Timer
	paused bool
	fired  bool
}

// arm starts the watchdog, which calls fire on expiry.
func (wd *watchdog) arm(fire func()) {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	wd.paused = false
	wd.timer = time.AfterFunc(wd.d, func() {
		wd.mu.Lock()
		expired := !wd.paused && !wd.fired
		wd.fired = wd.fired || expired
		wd.mu.Unlock()
		if expired {
			fire()
		}
	})
}

// kick restarts the countdown.
func (wd *watchdog) kick() {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	if wd.timer != nil && !wd.paused && !wd.fired {
		wd.timer.Reset(wd.d)
	}
}

// pause stops the countdown until resume.
func (wd *watchdog) pause() {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	wd.paused = true
	if wd.timer != nil {
		wd.timer.Stop()
	}
}

// resume restarts a paused countdown from d.
func (wd *watchdog) resume() {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	wd.paused = false
	if wd.timer != nil && !wd.fired {
		wd.timer.Reset(wd.d)
	}
}

func (wd *watchdog) isPaused() bool {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	return wd.paused
}

func (wd *watchdog) hasFired() bool {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	return wd.fired
}
