// Package etcdmembers follows the members of an ingestor cluster in etcd,
// for processor.RunCluster: each daemon in cluster mode keeps the key
// /ingestor/<cluster>/members/<member> under its lease, whose value names
// its event and ack endpoints. It is a package of its own so that the
// processor package does not pull in the etcd client.
package etcdmembers

import (
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ingestorhq/ingestor/processor"
)

// retry is the wait before reading the members again after etcd failed.
const retry = time.Second

// Members is a cluster's membership in etcd.
type Members struct {
	client  *clientv3.Client
	cluster string
	log     *slog.Logger
}

// New follows the members of cluster (the daemons' cluster.name) through
// client; log receives etcd's troubles (nil: slog.Default()).
func New(client *clientv3.Client, cluster string, log *slog.Logger) *Members {
	if log == nil {
		log = slog.Default()
	}
	return &Members{client: client, cluster: cluster, log: log}
}

// Watch implements processor.Members: it reads the member keys, reports
// them, then watches them and reports every change. While etcd cannot be
// reached it keeps the last list (the processors keep consuming from the
// members they know) and reads it again when etcd answers.
func (m *Members) Watch(ctx context.Context, update func([]processor.Member)) error {
	prefix := "/ingestor/" + m.cluster + "/members/"
	var last []processor.Member
	for ctx.Err() == nil {
		resp, err := m.client.Get(ctx, prefix, clientv3.WithPrefix())
		if err != nil {
			if ctx.Err() == nil {
				m.log.Warn("etcdmembers: reading the cluster's members failed; keeping the last list", "cluster", m.cluster, "err", err)
				sleep(ctx, retry)
			}
			continue
		}
		byKey := map[string]processor.Member{}
		for _, kv := range resp.Kvs {
			m.put(byKey, string(kv.Key), kv.Value)
		}
		last = report(update, last, byKey)
		wch := m.client.Watch(clientv3.WithRequireLeader(ctx), prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		for wr := range wch {
			if wr.Err() != nil {
				m.log.Warn("etcdmembers: watching the cluster's members failed; reading them again", "cluster", m.cluster, "err", wr.Err())
				break
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					delete(byKey, string(ev.Kv.Key))
					continue
				}
				m.put(byKey, string(ev.Kv.Key), ev.Kv.Value)
			}
			last = report(update, last, byKey)
		}
		sleep(ctx, retry)
	}
	return nil
}

// put records the member key's value, skipping one that does not decode.
func (m *Members) put(byKey map[string]processor.Member, key string, value []byte) {
	var mb processor.Member
	if err := json.Unmarshal(value, &mb); err != nil || mb.Name == "" || mb.Endpoint == "" || mb.AckEndpoint == "" {
		m.log.Warn("etcdmembers: skipping a member key that does not name a member and its endpoints", "key", key, "err", err)
		return
	}
	byKey[key] = mb
}

// report calls update with the members of byKey, sorted by name, when
// they differ from last, and returns them.
func report(update func([]processor.Member), last []processor.Member, byKey map[string]processor.Member) []processor.Member {
	list := slices.SortedFunc(maps.Values(byKey), func(a, b processor.Member) int { return strings.Compare(a.Name, b.Name) })
	if last != nil && slices.Equal(list, last) {
		return last
	}
	update(list)
	if list == nil {
		list = []processor.Member{}
	}
	return list
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
