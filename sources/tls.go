package sources

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
)

// minTLSVersion is the oldest TLS version the https and wss sources accept
// from a server.
const minTLSVersion = tls.VersionTLS12

// validateClientTLS checks the tls_ca_file and tls_insecure_skip_verify keys
// of a source whose URL is encrypted (secure) or not; needs names such a URL
// in the errors, e.g. "an https poll_url". Offline, tls_ca_file is not
// read, and unread says so.
func validateClientTLS(caFile string, insecure, secure bool, needs string, offline bool) (errs []FieldError, unread []string) {
	if caFile != "" {
		if !secure {
			errs = append(errs, FieldError{"tls_ca_file", "is only used with " + needs})
		} else if offline {
			unread = append(unread, "tls_ca_file")
		} else if _, err := loadCAFile(caFile); err != nil {
			errs = append(errs, FieldError{"tls_ca_file", err.Error()})
		}
		if insecure {
			errs = append(errs, FieldError{"tls_insecure_skip_verify", "cannot be combined with tls_ca_file"})
		}
	}
	if insecure && !secure {
		errs = append(errs, FieldError{"tls_insecure_skip_verify", "is only used with " + needs})
	}
	return errs, unread
}

// loadCAFile reads a PEM file of CA certificates.
func loadCAFile(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}

// clientTLSConfig builds the TLS client settings of a source: servers older
// than minTLSVersion are refused, certificates are checked against the CAs
// of caFile when set (else the system's), and not at all when insecure, which
// is logged as a warning. The error names the key at fault.
func clientTLSConfig(caFile string, insecure bool, logger *slog.Logger) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: minTLSVersion}
	if caFile != "" {
		pool, err := loadCAFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("tls_ca_file: %w", err)
		}
		cfg.RootCAs = pool
	}
	if insecure {
		cfg.InsecureSkipVerify = true
		logger.Warn("TLS CERTIFICATE VERIFICATION IS DISABLED (tls_insecure_skip_verify = true): " +
			"anyone on the network path can read and alter this feed and capture its credentials; use tls_ca_file instead")
	}
	return cfg, nil
}
