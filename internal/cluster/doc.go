// Package cluster lets several daemons share the polled sources through
// etcd ([cluster] in the config): etcd does the consensus, this package
// only follows its rules.
//
// A daemon joins as a Member: an etcd lease it keeps alive and a member
// key under it, /ingestor/<cluster>/members/<member>, naming the
// endpoints processors connect to. A member runs a source only while it
// holds the source's ownership key, /ingestor/<cluster>/sources/<source>/owner,
// created under its lease by a transaction that succeeds only when no one
// holds it (Acquire). The source's cursor checkpoint,
// /ingestor/<cluster>/sources/<source>/cursor, is written by a transaction
// conditioned on still holding that very key (Ownership.Checkpoint), so a
// member that lost it can never move the cursor.
//
// A member judges its lease from its own keepalives, never from etcd's
// view: the lease is valid locally until the send time of the last
// keepalive that etcd answered plus the lease's TTL, less a margin. etcd
// counts the TTL from when it received that keepalive (later), and renews
// every lease when it restarts or elects a leader (later still), so a
// member always sees its lease end before any other member can take its
// keys: a partitioned or paused member stops polling before anyone else
// may start.
//
// PlaceAll decides which live member runs each source: each source ranks
// the members by a rendezvous score, and PlaceAll takes the assignment of
// highest total score that keeps every member strictly within 10% of the
// mean load (the floor or ceiling of the mean for small sets). Sources
// leave their first choice only as far as those bounds require, so a
// member joining or leaving moves about its share of the sources, at most
// about 1.5 times it.
package cluster
