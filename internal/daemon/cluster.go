package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ingestorhq/ingestor/actors"
	"github.com/ingestorhq/ingestor/config"
	"github.com/ingestorhq/ingestor/internal/cluster"
	"github.com/ingestorhq/ingestor/sources"
)

// clusterHost is the daemon as cluster mode's coordinator drives it
// (cluster.Host): the pipeline starts and stops the sources placed here,
// the queue keeps their cursors. The coordinator itself, and every rule
// of placement, checkpoints and hand-overs, is internal/cluster's.
type clusterHost struct {
	d *Daemon
	// applyMu serializes the changes to the pipeline's sources: placement
	// and reloads.
	applyMu sync.Mutex
}

// clusterMode is the daemon's part of cluster mode: its host, the
// coordinator and the etcd client it owns.
type clusterMode struct {
	host   *clusterHost
	coord  *cluster.Coordinator
	client *clientv3.Client
	// closed makes shutdown run once.
	closed   sync.Once
	closeErr error
}

// memberInfo is the member key's value: what processors need to follow
// the member.
type memberInfo struct {
	Member   string `json:"member"`
	Events   string `json:"events"`
	Acks     string `json:"acks"`
	Version  string `json:"version"`
	Draining bool   `json:"draining,omitempty"`
}

// newClusterMode dials etcd (it does not wait for it) and prepares the
// coordinator; its Start runs it.
func newClusterMode(d *Daemon, cfg *config.Config) (*clusterMode, error) {
	name, err := cfg.Cluster.Member()
	if err != nil {
		return nil, err
	}
	mi := memberInfo{Member: name, Events: advertise(cfg.Publish.Endpoint, cfg.Cluster.AdvertiseHost),
		Acks: advertise(cfg.Publish.AckEndpoint, cfg.Cluster.AdvertiseHost), Version: Version()}
	info, err := json.Marshal(mi)
	if err != nil {
		return nil, err
	}
	mi.Draining = true
	draining, err := json.Marshal(mi)
	if err != nil {
		return nil, err
	}
	client, err := cluster.Dial(cfg.Cluster)
	if err != nil {
		return nil, err
	}
	host := &clusterHost{d: d}
	c := cfg.Cluster
	coord := cluster.NewCoordinator(client, host, cluster.CoordinatorOptions{
		Cluster: c.Name, Member: name, LeaseTTL: c.LeaseTTL, CheckpointInterval: c.CheckpointInterval,
		RebalanceDelay: c.RebalanceDelay, CompactInterval: c.CompactInterval, MaxTxnOps: c.MaxTxnOps,
		Info: info, DrainingInfo: draining, HandOverWait: cfg.Daemon.ShutdownGrace,
		Metrics: d.clusterMetrics, Logger: d.log.With("member", name),
	})
	return &clusterMode{host: host, coord: coord, client: client}, nil
}

// shutdown hands every source over with its settled cursor, leaves the
// cluster and closes the etcd client.
func (c *clusterMode) shutdown(ctx context.Context) error {
	c.closed.Do(func() {
		c.closeErr = errors.Join(c.coord.Shutdown(ctx), c.client.Close())
	})
	return c.closeErr
}

// advertise returns endpoint with a wildcard host (0.0.0.0, ::, *)
// replaced by host, when host is set.
func advertise(endpoint, host string) string {
	if host == "" {
		return endpoint
	}
	u, err := url.Parse(strings.Replace(endpoint, "://*:", "://0.0.0.0:", 1))
	if err != nil || u.Scheme != "tcp" {
		return endpoint
	}
	switch u.Hostname() {
	case "0.0.0.0", "::", "":
		return "tcp://" + joinHostPort(host, u.Port())
	}
	return endpoint
}

func joinHostPort(host, port string) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]:" + port
	}
	return host + ":" + port
}

// reload applies a reload's plan in cluster mode: the sources it stops or
// restarts are handed over if held here (all at once), the pipeline takes
// the new config, and placement runs again (a restarted source is taken
// again, likely here, with its new settings).
func (c *clusterMode) reload(ctx context.Context, plan config.Plan, next *config.Config, limiters *sources.RateLimiters) error {
	c.coord.HandOver(ctx, slices.Concat(plan.Stop, plan.Restart))
	h := c.host
	h.applyMu.Lock()
	err := h.d.pipeline.Apply(ctx, config.Plan{Stop: plan.Stop}, next.Sources, limiters)
	h.d.cfgNow.Store(next)
	h.d.limiters = limiters
	h.applyMu.Unlock()
	c.coord.Kick()
	return err
}

// placedStatus marks in s a polled source this member does not run: it
// is placed on another member, or on none yet.
func (c *clusterMode) placedStatus(src config.Source, s *SourceStatus) {
	if _, push := src.Spec.(sources.PushSpec); !src.Enabled || push {
		return
	}
	member, here := c.coord.Placement(src.Name)
	if here {
		return
	}
	s.State, s.Reason, s.Until, s.Late = actors.StateStopped, actors.ReasonElsewhere, nil, false
	switch member {
	case "":
		s.Detail = "not placed yet"
	case c.coord.Name():
		s.Detail = "placed here; waiting for the member holding it to hand it over"
	default:
		s.Detail = "placed on member " + member
	}
}

// Placeable implements cluster.Host: the enabled polled sources.
func (h *clusterHost) Placeable() []string {
	var names []string
	for _, s := range h.d.currentConfig().Sources {
		if _, push := s.Spec.(sources.PushSpec); s.Enabled && !push {
			names = append(names, s.Name)
		}
	}
	return names
}

// Start implements cluster.Host.
func (h *clusterHost) Start(ctx context.Context, source, cursor string, checkpointed bool) error {
	if checkpointed {
		if err := h.d.queue.SetCursor(ctx, source, cursor); err != nil {
			return err
		}
	}
	return h.apply(ctx, config.Plan{Start: []string{source}})
}

// HandOver implements cluster.Host.
func (h *clusterHost) HandOver(ctx context.Context, source string) error {
	h.applyMu.Lock()
	defer h.applyMu.Unlock()
	return h.d.pipeline.HandOver(ctx, source)
}

// Stop implements cluster.Host.
func (h *clusterHost) Stop(ctx context.Context, source string) error {
	return h.apply(ctx, config.Plan{Stop: []string{source}})
}

// Cursor implements cluster.Host.
func (h *clusterHost) Cursor(ctx context.Context, source string) (string, bool, error) {
	return h.d.queue.Cursor(ctx, source)
}

// Settled implements cluster.Host.
func (h *clusterHost) Settled(ctx context.Context, names []string) (map[string]string, error) {
	return h.d.queue.SettledCursors(ctx, names)
}

// Forget implements cluster.Host.
func (h *clusterHost) Forget(source string) { h.d.queue.ForgetSettled(source) }

// apply changes the pipeline's running sources; placement and reloads
// take turns.
func (h *clusterHost) apply(ctx context.Context, plan config.Plan) error {
	h.applyMu.Lock()
	defer h.applyMu.Unlock()
	cfg := h.d.currentConfig()
	if err := h.d.pipeline.Apply(ctx, plan, cfg.Sources, h.d.limiters); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	return nil
}
