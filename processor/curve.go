package processor

import (
	"errors"
	"fmt"

	zmq "github.com/pebbe/zmq4"

	"github.com/ingestorhq/ingestor/internal/curvekey"
)

// ReadCurveKey reads a CURVE key file as `ingestor curve-keygen` writes
// them: one Z85 key on a line, with blank lines and lines starting with #
// ignored. Use it to fill Options.CurveServerKey from the daemon's .pub file
// and Options.CurveSecretKey from the processor's .key file. Errors name the
// file and line, never the key.
func ReadCurveKey(path string) (string, error) {
	key, err := curvekey.ReadKey(path)
	if err != nil {
		return "", fmt.Errorf("processor: read CURVE key: %w", err)
	}
	return key, nil
}

// curveClient is the CURVE client role of both sockets.
type curveClient struct {
	server, public, secret string
}

// newCurveClient checks the CURVE options; it returns nil when both are
// empty. Errors never contain a key.
func newCurveClient(serverKey, secretKey string) (*curveClient, error) {
	switch {
	case serverKey == "" && secretKey == "":
		return nil, nil
	case serverKey == "":
		return nil, errors.New("curve server key is required with a curve secret key")
	case secretKey == "":
		return nil, errors.New("curve secret key is required with a curve server key")
	}
	if err := curvekey.Check(serverKey); err != nil {
		return nil, fmt.Errorf("curve server key: %w", err)
	}
	if err := curvekey.Check(secretKey); err != nil {
		return nil, fmt.Errorf("curve secret key: %w", err)
	}
	public, err := curvekey.Public(secretKey)
	if err != nil {
		return nil, fmt.Errorf("curve secret key: %w", err)
	}
	return &curveClient{server: serverKey, public: public, secret: secretKey}, nil
}

// secure makes sock a CURVE client of the daemon; a nil c leaves it plain.
func (c *curveClient) secure(sock *zmq.Socket) error {
	if c == nil {
		return nil
	}
	return errors.Join(sock.SetCurveServerkey(c.server), sock.SetCurvePublickey(c.public), sock.SetCurveSecretkey(c.secret))
}
