package cluster

import (
	"crypto/tls"
	"fmt"
	"net/url"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"

	"github.com/ingestorhq/ingestor/config"
)

// dialTimeout bounds the first connection to etcd.
const dialTimeout = 5 * time.Second

// Dial returns an etcd client for c's endpoints, with its TLS settings and
// user. It does not wait for etcd: calls fail until it answers.
func Dial(c config.Cluster) (*clientv3.Client, error) {
	cfg := clientv3.Config{
		Endpoints:            c.EtcdEndpoints,
		Username:             c.EtcdUsername,
		Password:             c.EtcdPassword,
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		// etcd's own zap logs stay out of the daemon's log; errors reach
		// it through the calls that fail.
		Logger: zap.NewNop(),
		// gRPC's default reconnect backoff grows to two minutes: after an
		// etcd outage of 20 s a member would wait seconds more for its
		// next attempt. A second at most lets it join again at once.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           grpcbackoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 2 * time.Second,
		})},
	}
	https := slices.ContainsFunc(c.EtcdEndpoints, func(ep string) bool {
		u, err := url.Parse(ep)
		return err == nil && u.Scheme == "https"
	})
	if https || c.EtcdCertFile != "" {
		t := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.EtcdCAFile != "" {
			pool, err := config.LoadClientCAs(c.EtcdCAFile)
			if err != nil {
				return nil, fmt.Errorf("etcd CA: %w", err)
			}
			t.RootCAs = pool
		}
		if c.EtcdCertFile != "" {
			cert, err := tls.LoadX509KeyPair(c.EtcdCertFile, c.EtcdKeyFile)
			if err != nil {
				return nil, fmt.Errorf("etcd client certificate: %w", err)
			}
			t.Certificates = []tls.Certificate{cert}
		}
		cfg.TLS = t
	}
	client, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd client for %v: %w", c.EtcdEndpoints, err)
	}
	return client, nil
}
