"""ingestor_processor is the Python client for the ingestor daemon's
processor protocol (PROTOCOL.md at the repository root), with the semantics
of the Go package github.com/ingestorhq/ingestor/processor: strict frame
decoding, batched acks, retryable and permanent nacks, deduplication by
(source, key) and exactly-once effects in SQLite, ZeroMQ CURVE, and
following the members of a cluster of daemons (Cluster, with StaticMembers
or EtcdMembers).

    import ingestor_processor as ip

    client = ip.Client("tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558")

    def handle(conn, ev):  # inside the frame's transaction
        if ev.is_json and not isinstance(ev.payload, dict):
            raise ip.Permanent("payload is not an object")  # dead-lettered
        conn.execute("INSERT INTO events VALUES (?, ?, ?)", (ev.source, ev.key, ev.data()))

    client.run_tx("sink.db", handle)  # until client.stop()
"""

# The package's version, stated here only: pyproject.toml reads it.
__version__ = "0.1.0"

from .acks import MAX_BATCH_BYTES, MAX_BATCH_FRAMES, MAX_BATCH_KEYS, AckBatch
from .client import (DEFAULT_ACK_FLUSH_INTERVAL, DEFAULT_DEDUPE_CACHE_SIZE, DEFAULT_DEDUPE_RETENTION, DEFAULT_RECEIVE_HWM, Client,
                     Permanent, Stats, check_curve_key, open_database, read_curve_key,
                     read_curve_secret)
from .cluster import (DEFAULT_ETCD_INTERVAL, DEFAULT_ETCD_TIMEOUT, Cluster, EtcdError, EtcdMembers, Member,
                      StaticMembers)
from .malloc import tune_malloc
from .wire import (MAX_REASON_BYTES, VERSION, Event, Frame, MalformedFrame, cut_reason, decode_frame, decode_frame_trusted,
                   encode_ack)

__all__ = [
    "AckBatch", "Client", "Cluster", "DEFAULT_ACK_FLUSH_INTERVAL", "DEFAULT_DEDUPE_CACHE_SIZE", "DEFAULT_DEDUPE_RETENTION", "DEFAULT_ETCD_INTERVAL",
    "DEFAULT_ETCD_TIMEOUT", "DEFAULT_RECEIVE_HWM", "EtcdError", "EtcdMembers", "Event", "Frame", "MAX_BATCH_BYTES",
    "MAX_BATCH_FRAMES", "MAX_BATCH_KEYS", "MAX_REASON_BYTES", "MalformedFrame", "Member", "Permanent", "StaticMembers",
    "Stats", "VERSION", "check_curve_key", "cut_reason", "decode_frame", "decode_frame_trusted", "encode_ack", "open_database",
    "read_curve_key", "read_curve_secret", "tune_malloc",
]
