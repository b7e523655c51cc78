// Package curvekey reads, checks and writes ZeroMQ CURVE keys in their Z85
// text form, the 40-character encoding of a 32-byte key that libzmq's
// ZMQ_CURVE_* socket options take.
//
// A key file holds keys one per line; blank lines and lines starting with
// # are ignored, as is whitespace around a key. A secret key file holds
// exactly one key and must not be readable by every user. Errors name the
// file and line but never repeat a key, secret or not.
package curvekey

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	zmq "github.com/pebbe/zmq4"
)

// Len is the length of a key in Z85.
const Len = 40

// z85Alphabet is the Z85 alphabet (ZeroMQ RFC 32), in digit order.
const z85Alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"

// Check reports whether key is a CURVE key in Z85: 40 characters of the Z85
// alphabet, each group of five encoding a 32-bit value. zmq4's Z85decode
// does not report invalid input, hence this check. The error does not
// contain the key.
func Check(key string) error {
	if len(key) != Len {
		return fmt.Errorf("not a Z85 CURVE key: want %d characters, got %d", Len, len(key))
	}
	for i := 0; i < Len; i += 5 {
		var v uint64
		for j := i; j < i+5; j++ {
			d := strings.IndexByte(z85Alphabet, key[j])
			if d < 0 {
				return fmt.Errorf("not a Z85 CURVE key: character %d is outside the Z85 alphabet", j+1)
			}
			v = v*85 + uint64(d)
		}
		if v > 0xFFFFFFFF {
			return fmt.Errorf("not a Z85 CURVE key: characters %d to %d encode more than 32 bits", i+1, i+5)
		}
	}
	return nil
}

// Supported returns an error saying so when libzmq was built without CURVE.
func Supported() error {
	if !zmq.HasCurve() {
		major, minor, patch := zmq.Version()
		return fmt.Errorf("this libzmq (%d.%d.%d) was built without CURVE security: "+
			"install one built with libsodium (Debian's libzmq5 is)", major, minor, patch)
	}
	return nil
}

// Public returns the public key of a Z85 secret key.
func Public(secret string) (string, error) {
	if err := Check(secret); err != nil {
		return "", err
	}
	if err := Supported(); err != nil {
		return "", err
	}
	pub, err := zmq.AuthCurvePublic(secret)
	if err != nil {
		return "", fmt.Errorf("derive the CURVE public key: %w", err)
	}
	return pub, nil
}

// ReadKeys reads a file of one or more Z85 keys, checking each.
func ReadKeys(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var keys []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 1; sc.Scan(); line++ {
		key := strings.TrimSpace(sc.Text())
		if key == "" || strings.HasPrefix(key, "#") {
			continue
		}
		if err := Check(key); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		keys = append(keys, key)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%s: holds no key", path)
	}
	return keys, nil
}

// ReadKey reads a file that holds exactly one Z85 key.
func ReadKey(path string) (string, error) {
	keys, err := ReadKeys(path)
	if err != nil {
		return "", err
	}
	if len(keys) != 1 {
		return "", fmt.Errorf("%s: holds %d keys, want one", path, len(keys))
	}
	return keys[0], nil
}

// ReadSecret reads a secret key file: one Z85 key, in a file not readable
// by every user.
func ReadSecret(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if fi.Mode().Perm()&0o004 != 0 {
		return "", fmt.Errorf("%s: a secret key must not be readable by every user (mode %04o): chmod 600 it", path, fi.Mode().Perm())
	}
	return ReadKey(path)
}

// Generate makes a new key pair and writes it: the secret key to base+".key"
// with mode 0600, and the public key to base+".pub" with mode 0644. It
// refuses to overwrite either file and returns the public key and the two
// paths.
func Generate(base string) (public, secretPath, publicPath string, err error) {
	if err := Supported(); err != nil {
		return "", "", "", err
	}
	pub, sec, err := zmq.NewCurveKeypair()
	if err != nil {
		return "", "", "", fmt.Errorf("generate a CURVE key pair: %w", err)
	}
	secretPath, publicPath = base+".key", base+".pub"
	name := filepath.Base(base)
	if err := create(secretPath, 0o600, fmt.Sprintf("# CURVE secret key %s: keep it private. Public key: %s\n%s\n", name, pub, sec)); err != nil {
		return "", "", "", err
	}
	if err := create(publicPath, 0o644, fmt.Sprintf("# CURVE public key %s\n%s\n", name, pub)); err != nil {
		return "", "", "", errors.Join(err, os.Remove(secretPath))
	}
	return pub, secretPath, publicPath, nil
}

// create writes a new file with mode perm, failing if it exists.
func create(path string, perm os.FileMode, content string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(content); err != nil {
		return errors.Join(fmt.Errorf("write %s: %w", path, err), f.Close(), os.Remove(path))
	}
	if err := f.Close(); err != nil {
		return errors.Join(fmt.Errorf("write %s: %w", path, err), os.Remove(path))
	}
	return nil
}
