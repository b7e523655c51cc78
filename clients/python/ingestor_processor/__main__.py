"""The example processor: writes every event exactly once into the table
events of a SQLite database.

    ingestor-processor-py --sqlite sink.db [--connect tcp://127.0.0.1:5557]
        [--ack tcp://127.0.0.1:5558] [--fail-keys REGEX]
        [--curve-server-key daemon.pub --curve-secret-key processor.key]
        [--etcd URL[,URL...] [--cluster NAME] [--etcd-ca FILE]
         [--etcd-cert FILE --etcd-key FILE] [--etcd-user NAME]]
        [--member NAME=EVENTS,ACKS ...]

ingestor-processor-py is the console script pip installs; python3 -m
ingestor_processor runs the same.

With --etcd it follows a cluster of daemons (their [cluster] mode) instead
of one daemon: it reads the members from etcd every second and consumes
from each member's endpoints, starting and stopping as members join and
leave (the etcd password, with --etcd-user, comes from the environment
variable INGESTOR_ETCD_PASSWORD). --member, repeated, gives the members by
hand instead. All members' events go into the one database, so an event
two members sent (fetched again after a failover) is applied once.

Each row commits together with the event's processed key (Client.run_tx),
so a redelivered event is skipped. The insert is a plain INSERT into a table
whose primary key is (source, key): an event applied twice would fail
loudly; such a failure is logged as a BUG and counted. --fail-keys fails the
events whose key matches permanently, so the daemon dead-letters them.
SIGINT or SIGTERM stops it gracefully: it sends its acks and logs a summary.
"""

import argparse
import logging
import os
import re
import signal
import sqlite3
import sys

from . import (DEFAULT_DEDUPE_RETENTION, Client, Cluster, EtcdMembers, Member, Permanent, StaticMembers, __version__,
               read_curve_key, read_curve_secret, tune_malloc)

EVENTS_SCHEMA = """CREATE TABLE IF NOT EXISTS events (
    source TEXT NOT NULL,
    key TEXT NOT NULL,
    seq INTEGER NOT NULL,
    payload BLOB,
    PRIMARY KEY (source, key)
)"""


def main(argv=None, prog="python3 -m ingestor_processor"):
    tune_malloc()  # ZeroMQ's message buffers are reused, not faulted in again
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("--connect", default="tcp://127.0.0.1:5557", help="the daemon's publish.endpoint")
    p.add_argument("--ack", default="tcp://127.0.0.1:5558", help="the daemon's publish.ack_endpoint")
    p.add_argument("--sqlite", required=True, help="the SQLite database to write events into")
    p.add_argument("--retention", type=float, default=DEFAULT_DEDUPE_RETENTION, metavar="SECONDS",
                   help="forget a processed key this long after it was applied, counted in running time "
                        "(default a week; negative: never)")
    p.add_argument("--fail-keys", help="fail events whose key matches this regular expression permanently")
    p.add_argument("--curve-server-key", help="file of the daemon's CURVE public key")
    p.add_argument("--curve-secret-key", help="file of this processor's CURVE secret key")
    p.add_argument("--etcd", help="follow a cluster of daemons: its etcd endpoints, comma-separated "
                   "(instead of --connect and --ack)")
    p.add_argument("--cluster", default="ingestor", help="with --etcd: the cluster's name (the daemons' cluster.name)")
    p.add_argument("--etcd-ca", help="with --etcd: PEM file of the CAs etcd's certificate is verified against")
    p.add_argument("--etcd-cert", help="with --etcd: PEM file of a client certificate for etcd")
    p.add_argument("--etcd-key", help="with --etcd: PEM file of the client certificate's key")
    p.add_argument("--etcd-user", help="with --etcd: etcd user name (password from $INGESTOR_ETCD_PASSWORD)")
    p.add_argument("--member", action="append", default=[], metavar="NAME=EVENTS,ACKS",
                   help="follow a cluster member given by hand (repeat for each; instead of --connect and --ack)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    log = logging.getLogger("processor")
    fail = re.compile(args.fail_keys) if args.fail_keys else None
    if (args.curve_server_key is None) != (args.curve_secret_key is None):
        p.error("--curve-server-key and --curve-secret-key go together")
    server = secret = None
    if args.curve_server_key:
        server, secret = read_curve_key(args.curve_server_key), read_curve_secret(args.curve_secret_key)
    members = cluster_members(p, args)
    if members is None:
        client = Client(args.connect, args.ack, curve_server_key=server, curve_secret_key=secret,
                        dedupe_retention=args.retention)
    else:
        client = Cluster(members, curve_server_key=server, curve_secret_key=secret, dedupe_retention=args.retention)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: client.stop())

    doubles = 0

    def handle(conn, ev):
        nonlocal doubles
        if fail is not None and fail.search(ev.key):
            raise Permanent(f"key {ev.key!r} matches --fail-keys")
        try:
            conn.execute("INSERT INTO events (source, key, seq, payload) VALUES (?, ?, ?, ?)",
                         (ev.source, ev.key, ev.seq, ev.data()))
        except sqlite3.IntegrityError as e:
            doubles += 1
            log.error("BUG: event %s/%s applied twice; exactly-once delivery failed: %s", ev.source, ev.key, e)
            raise Permanent(f"event {ev.source}/{ev.key} applied twice: {e}") from e

    conn = sqlite3.connect(args.sqlite, isolation_level=None, timeout=10.0)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(EVENTS_SCHEMA)
        # A cluster's clients open the database on their own threads.
        client.run_tx(conn if members is None else args.sqlite, handle)
        rows = conn.execute("SELECT count(*) FROM events").fetchone()[0]
    finally:
        conn.close()
    log.info("summary: %s, rows %d, double applications %d", client.stats, rows, doubles)
    return 1 if doubles else 0


def cluster_members(p, args):
    """Returns the members --etcd or --member name, or None for one daemon."""
    if args.etcd and args.member:
        p.error("--etcd and --member exclude each other")
    if args.member:
        members = []
        for spec in args.member:
            name, _, eps = spec.partition("=")
            events, _, acks = eps.partition(",")
            if not name or not events or not acks:
                p.error(f"--member {spec!r}: want NAME=EVENTS_ENDPOINT,ACK_ENDPOINT")
            members.append(Member(name, events, acks))
        return StaticMembers(members)
    if not args.etcd:
        for flag in ("etcd_ca", "etcd_cert", "etcd_key", "etcd_user"):
            if getattr(args, flag):
                p.error(f"--{flag.replace('_', '-')} needs --etcd")
        return None
    password = None
    if args.etcd_user:
        password = os.environ.get("INGESTOR_ETCD_PASSWORD")
        if password is None:
            p.error("--etcd-user needs the password in $INGESTOR_ETCD_PASSWORD")
    try:
        return EtcdMembers(args.etcd, args.cluster, ca_file=args.etcd_ca, cert_file=args.etcd_cert,
                           key_file=args.etcd_key, username=args.etcd_user, password=password)
    except (ValueError, OSError) as e:
        p.error(f"--etcd: {e}")


def console_script():
    """The ingestor-processor-py command pip installs."""
    return main(prog=os.path.basename(sys.argv[0]) or "ingestor-processor-py")


if __name__ == "__main__":
    sys.exit(main())
