package delivery

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/ingestorhq/ingestor/internal/curvekey"
)

// zapEndpoint is where libzmq sends the ZAP requests (ZeroMQ RFC 27) of
// every socket of a context.
const zapEndpoint = "inproc://zeromq.zap.01"

// zapDomain is the ZAP domain of the daemon's sockets.
const zapDomain = "ingestor"

// CurveServer makes the daemon's sockets CURVE servers that admit only the
// authorized processor keys. It answers the ZAP requests of one ZeroMQ
// context on a goroutine of its own, which ends when the context is
// terminated.
//
// zmq4's own ZAP handler (AuthStart, AuthCurveAdd) is not used: it is
// process-global state bound in zmq4's default context, so it never sees
// the requests of the daemon's own context (libzmq then admits any client
// that knows the server's public key), it cannot serve two daemons with
// different keys in one process, and its key maps are not synchronised.
// One CurveServer per context has none of these problems.
type CurveServer struct {
	secret string
	// allowed holds the authorized public keys in binary, as ZAP
	// requests carry them.
	allowed map[string]bool
	log     *slog.Logger
	zap     *zmq.Socket
	// refused counts refused handshakes; lastWarn is when one was last
	// logged as a warning (the handler's goroutine only).
	refused  atomic.Int64
	lastWarn time.Time
}

// refusalLogEvery spaces the warnings about refused processors: a
// misconfigured one retries its handshake several times a second.
const refusalLogEvery = time.Minute

// NewCurveServer checks the keys, binds the ZAP handler in zctx and starts
// answering. Call it before the sockets it secures are bound; the handler
// stops when zctx is terminated, after they are closed.
func NewCurveServer(zctx *zmq.Context, secretKey string, authorized []string, log *slog.Logger) (*CurveServer, error) {
	if err := curvekey.Supported(); err != nil {
		return nil, err
	}
	if err := curvekey.Check(secretKey); err != nil {
		return nil, fmt.Errorf("curve secret key: %w", err)
	}
	if len(authorized) == 0 {
		return nil, errors.New("curve: no processor key is authorized")
	}
	c := &CurveServer{secret: secretKey, allowed: make(map[string]bool, len(authorized)), log: log}
	for i, k := range authorized {
		if err := curvekey.Check(k); err != nil {
			return nil, fmt.Errorf("curve authorized key %d: %w", i+1, err)
		}
		c.allowed[zmq.Z85decode(k)] = true
	}
	zap, err := zctx.NewSocket(zmq.REP)
	if err != nil {
		return nil, fmt.Errorf("zap socket: %w", err)
	}
	if err := errors.Join(zap.SetLinger(0), zap.Bind(zapEndpoint)); err != nil {
		return nil, fmt.Errorf("zap socket %s: %w", zapEndpoint, errors.Join(err, zap.Close()))
	}
	c.zap = zap
	go c.serve()
	return c, nil
}

// secure makes sock a CURVE server checked by c; a nil c leaves it plain.
func (c *CurveServer) secure(sock *zmq.Socket) error {
	if c == nil {
		return nil
	}
	return errors.Join(sock.SetCurveServer(1), sock.SetCurveSecretkey(c.secret), sock.SetZapDomain(zapDomain))
}

// Refused returns how many handshakes were refused for a key that is not
// authorized.
func (c *CurveServer) Refused() int64 { return c.refused.Load() }

// serve answers ZAP requests until the context is terminated. A request
// it cannot read or does not understand is refused.
func (c *CurveServer) serve() {
	defer func() {
		if err := c.zap.Close(); err != nil {
			c.log.Warn("close zap socket", "err", err)
		}
	}()
	for {
		req, err := c.zap.RecvMessageBytes(0)
		if err != nil {
			if zmq.AsErrno(err) != zmq.ETERM {
				c.log.Error("zap handler stopped: new processors can no longer connect", "err", err)
			}
			return
		}
		if _, err := c.zap.SendMessage(c.reply(req)); err != nil {
			if zmq.AsErrno(err) != zmq.ETERM {
				c.log.Error("zap handler stopped: new processors can no longer connect", "err", err)
			}
			return
		}
	}
}

// reply answers one ZAP request: version, request id, domain, address,
// identity, mechanism and credentials; for CURVE the one credential is the
// client's 32-byte public key.
func (c *CurveServer) reply(req [][]byte) [][]byte {
	if len(req) < 6 {
		c.log.Warn("refused a malformed zap request", "parts", len(req))
		// A REP socket must answer; libzmq drops a reply it cannot use.
		return [][]byte{[]byte("1.0"), nil, []byte("500"), []byte("malformed request"), nil, nil}
	}
	version, id, address, mechanism := req[0], req[1], string(req[3]), string(req[5])
	status, text := "400", "not an authorized processor key"
	if mechanism == "CURVE" && len(req) == 7 && c.allowed[string(req[6])] {
		status, text = "200", "OK"
	} else {
		n := c.refused.Add(1)
		attrs := []any{"address", address, "mechanism", mechanism, "refused_total", n}
		if now := time.Now(); now.Sub(c.lastWarn) >= refusalLogEvery {
			c.lastWarn = now
			c.log.Warn("refused a processor connection: its CURVE key is not in curve_authorized_keys_file "+
				"(further refusals are logged at debug level for a minute)", attrs...)
		} else {
			c.log.Debug("refused a processor connection: its CURVE key is not authorized", attrs...)
		}
	}
	return [][]byte{version, id, []byte(status), []byte(text), nil, nil}
}
