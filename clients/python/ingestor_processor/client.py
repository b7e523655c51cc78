"""The processor client: receives events frames from the daemon, hands each
event to a handler and acknowledges what the handler accepted."""

import collections
import logging
import os
import sqlite3
import threading
import time

import zmq

from .acks import AckBatch, frame_result
from .wire import MalformedFrame, decode_frame, decode_frame_trusted

log = logging.getLogger("ingestor_processor")

DEFAULT_RECEIVE_HWM = 1000
DEFAULT_ACK_FLUSH_INTERVAL = 0.020  # seconds
DEFAULT_DEDUPE_CACHE_SIZE = 100_000
# DEFAULT_DEDUPE_RETENTION is how long a processed key is remembered, in
# seconds of the processor's running time: a week, as the Go client.
DEFAULT_DEDUPE_RETENTION = 7 * 24 * 3600.0

# _POLL_INTERVAL bounds how long run goes without noticing stop(), in ms.
_POLL_INTERVAL = 100
# _CLOSE_LINGER bounds how long the acks still queued at stop may take to
# leave, in seconds.
_CLOSE_LINGER = 1.0

PROCESSED_SCHEMA = """CREATE TABLE IF NOT EXISTS processed (
    source TEXT NOT NULL,
    key TEXT NOT NULL,
    processed_at INTEGER NOT NULL,
    PRIMARY KEY (source, key)
) WITHOUT ROWID"""
_SELECT_PROCESSED = "SELECT 1 FROM processed WHERE source = ? AND key = ?"
_INSERT_PROCESSED = "INSERT INTO processed (source, key, processed_at) VALUES (?, ?, ?)"
# _RECORD_PROCESSED tolerates a pair another processor recorded first.
_RECORD_PROCESSED = "INSERT OR IGNORE INTO processed (source, key, processed_at) VALUES (?, ?, ?)"

# The retention of processed keys counts the processor's running time, not
# the wall clock (PROTOCOL.md, "How long to remember a key"): processed_at
# holds the processor's clock, which starts at the wall time when the
# database is first used and advances only while a client runs;
# processed_clock keeps it across restarts. The Go client uses the same
# tables, so either can follow the other on one database.
_CLOCK_SCHEMA = """CREATE TABLE IF NOT EXISTS processed_clock (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    now INTEGER NOT NULL
)"""
_CLOCK_INDEX = "CREATE INDEX IF NOT EXISTS processed_by_time ON processed(processed_at)"
_SELECT_CLOCK = "SELECT now FROM processed_clock WHERE id = 1"
_STORE_CLOCK = ("INSERT INTO processed_clock (id, now) VALUES (1, ?) "
                "ON CONFLICT (id) DO UPDATE SET now = max(now, excluded.now)")
_FORGET_BATCH = ("DELETE FROM processed WHERE (source, key) IN "
                 "(SELECT source, key FROM processed WHERE processed_at < ? ORDER BY processed_at LIMIT ?)")
_FORGET_LIMIT = 1000


class _Forgetter:
    """The processor's clock of a processed table, and the deletion of the
    keys older than the retention: at most once an interval, between
    frames, a thousand keys per statement, each its own transaction. A
    negative retention keeps every key (the clock is still kept)."""

    def __init__(self, conn, retention, stats):
        conn.execute(_CLOCK_SCHEMA)
        conn.execute(_CLOCK_INDEX)
        row = conn.execute(_SELECT_CLOCK).fetchone()
        if row is None:
            self._base = time.time_ns()
            conn.execute(_STORE_CLOCK, (self._base,))
        else:
            self._base = row[0]
        self._started = time.monotonic_ns()
        self._conn = conn
        self._retention = retention
        self._stats = stats
        self._interval = 60.0 if retention < 0 else min(max(retention / 10, 1.0), 60.0)
        self._due = 0.0  # the first pass comes with the first frame

    def now(self):
        """The clock, in nanoseconds."""
        return self._base + time.monotonic_ns() - self._started

    def maybe(self):
        """Makes a pass when one is due. Call it outside a transaction."""
        if time.monotonic() < self._due:
            return
        self._due = time.monotonic() + self._interval
        self.run()

    def run(self):
        """Saves the clock, then deletes the keys past the retention."""
        now = self.now()
        self._conn.execute(_STORE_CLOCK, (now,))
        if self._retention < 0:
            return
        bound = now - int(self._retention * 1e9)
        while True:
            n = self._conn.execute(_FORGET_BATCH, (bound, _FORGET_LIMIT)).rowcount
            self._stats.forgotten += n
            if n < _FORGET_LIMIT:
                return

    def save(self):
        """Saves the clock (at stop)."""
        self._conn.execute(_STORE_CLOCK, (self.now(),))


class Permanent(Exception):
    """Raised by a handler for an event that retrying cannot help (it is
    malformed, fails validation, is poison): the event is nacked as
    permanent and the daemon moves it to its dead-letter list at once, with
    the exception's text as the reason. Any other exception is a retryable
    nack: the daemon delivers the event again on its backoff schedule."""


class Stats:
    """A client's counters since it was made."""

    __slots__ = ("frames", "events", "acked", "failed", "permanent", "duplicates", "malformed", "redeliveries",
                 "forgotten")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self):
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self):
        return "Stats(" + ", ".join(f"{k}={v}" for k, v in self.as_dict().items()) + ")"


_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_DIGITS = {c: i for i, c in enumerate(_Z85)}


def check_curve_key(key):
    """Raises ValueError unless key is a CURVE key in Z85: 40 characters of
    the Z85 alphabet, each group of five encoding 32 bits. The error never
    contains the key."""
    if type(key) is not str or len(key) != 40:
        n = len(key) if isinstance(key, str) else type(key).__name__
        raise ValueError(f"not a Z85 CURVE key: want 40 characters, got {n}")
    for i in range(0, 40, 5):
        v = 0
        for j in range(i, i + 5):
            d = _Z85_DIGITS.get(key[j])
            if d is None:
                raise ValueError(f"not a Z85 CURVE key: character {j + 1} is outside the Z85 alphabet")
            v = v * 85 + d
        if v > 0xFFFFFFFF:
            raise ValueError(f"not a Z85 CURVE key: characters {i + 1} to {i + 5} encode more than 32 bits")


def read_curve_key(path):
    """Returns the one Z85 key in the file at path, as `ingestor
    curve-keygen` writes them (NAME.pub, NAME.key): blank lines and lines
    starting with # are skipped. Errors name the file and line, never the
    key."""
    keys = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                check_curve_key(line)
            except ValueError as e:
                raise ValueError(f"{path}:{n}: {e}") from None
            keys.append(line)
    if len(keys) != 1:
        raise ValueError(f"{path}: holds {len(keys)} keys, want one")
    return keys[0]


def read_curve_secret(path):
    """Is read_curve_key for a secret key file (NAME.key): it refuses a file
    readable by every user."""
    mode = os.stat(path).st_mode & 0o777
    if mode & 0o004:
        raise ValueError(f"{path}: a secret key must not be readable by every user (mode {mode:04o}): chmod 600 it")
    return read_curve_key(path)


def open_database(path):
    """Opens the SQLite database at path for run_tx: transactions are
    managed by the client (isolation_level None), WAL, synchronous=FULL and
    a 10 s busy timeout, so that several processors can share it."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=10.0, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
    except BaseException:
        conn.close()
        raise
    return conn


class _KeyCache:
    """A bounded set of processed (source, key) pairs that forgets the least
    recently used first. It only answers "known to be processed"; a miss
    must be looked up in the processed table."""

    def __init__(self, size):
        self._size = size
        self._items = collections.OrderedDict()

    def has(self, source, key):
        k = (source, key)
        if k in self._items:
            self._items.move_to_end(k)
            return True
        return False

    def add(self, source, key):
        k = (source, key)
        self._items[k] = None
        self._items.move_to_end(k)
        while len(self._items) > self._size:
            self._items.popitem(last=False)


def _curve_keys(server, secret):
    """Returns the server, public and secret keys for the sockets, or raises
    ValueError naming the bad key, never its value."""
    try:
        check_curve_key(server)
    except ValueError as e:
        raise ValueError(f"curve server key: {e}") from None
    try:
        check_curve_key(secret)
    except ValueError as e:
        raise ValueError(f"curve secret key: {e}") from None
    if not zmq.has("curve"):
        raise ValueError(f"this libzmq ({zmq.zmq_version()}) was built without CURVE security")
    return server.encode("ascii"), zmq.curve_public(secret.encode("ascii")), secret.encode("ascii")


def _reason(e):
    """Returns the text of a nack for the exception e."""
    if isinstance(e, Permanent):
        return str(e) or "rejected by processor"
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class Client:
    """Receives events from a daemon and acknowledges them.

    endpoint and ack_endpoint are the daemon's publish.endpoint and
    publish.ack_endpoint. receive_hwm bounds the frames queued on the
    receiving socket; ack_flush_interval (seconds) is the longest an ack
    waits in a batch while frames keep arriving. With dedupe_db, run records
    every processed (source, key) in that SQLite database and skips events
    found there (run_tx keeps them in its own database instead).
    curve_server_key (the daemon's public key) and curve_secret_key (this
    processor's secret key), both Z85, make both sockets CURVE clients.
    Frames are decoded trusting the daemon (decode_frame_trusted: each JSON
    payload is parsed only when a handler reads Event.payload, and one that
    is not JSON then raises MalformedFrame in the handler, a retryable
    nack); validate_payloads=True parses every payload as the frame is
    decoded, dropping a frame with an invalid one as malformed.

    run and run_tx block until stop() is called (from a signal handler or
    another thread); only one may be active at a time.
    """

    def __init__(self, endpoint="tcp://127.0.0.1:5557", ack_endpoint="tcp://127.0.0.1:5558", *,
                 receive_hwm=DEFAULT_RECEIVE_HWM, ack_flush_interval=DEFAULT_ACK_FLUSH_INTERVAL,
                 dedupe_db=None, dedupe_cache_size=DEFAULT_DEDUPE_CACHE_SIZE,
                 dedupe_retention=DEFAULT_DEDUPE_RETENTION,
                 curve_server_key=None, curve_secret_key=None, validate_payloads=False, logger=None):
        errs = []
        if not endpoint:
            errs.append("endpoint is required")
        if not ack_endpoint:
            errs.append("ack endpoint is required")
        if endpoint and endpoint == ack_endpoint:
            errs.append(f"ack endpoint must differ from endpoint {endpoint!r}")
        if receive_hwm < 0:
            errs.append(f"receive HWM must not be negative, not {receive_hwm}")
        if ack_flush_interval < 0:
            errs.append(f"ack flush interval must not be negative, not {ack_flush_interval}")
        if dedupe_cache_size < 1:
            errs.append(f"dedupe cache size must be at least 1, not {dedupe_cache_size}")
        self._curve = None
        if curve_server_key or curve_secret_key:
            if not curve_server_key:
                errs.append("curve server key is required with a curve secret key")
            elif not curve_secret_key:
                errs.append("curve secret key is required with a curve server key")
            else:
                try:
                    self._curve = _curve_keys(curve_server_key, curve_secret_key)
                except ValueError as e:
                    errs.append(str(e))
        if errs:
            raise ValueError("ingestor_processor: " + "; ".join(errs))
        self.endpoint = endpoint
        self.ack_endpoint = ack_endpoint
        self.validate_payloads = validate_payloads
        self.receive_hwm = receive_hwm
        self.ack_flush_interval = ack_flush_interval
        self.dedupe_db = dedupe_db
        self.dedupe_cache_size = dedupe_cache_size
        self.dedupe_retention = dedupe_retention
        self.log = logger or log
        self.stats = Stats()
        self._stop = threading.Event()
        self._running = threading.Lock()

    def stop(self):
        """Asks run or run_tx to stop: the handler finishes the event it is
        on, the acks held are sent and run returns. Safe to call from a
        signal handler and from any thread, also before run starts. A
        stopped client stays stopped: make a new one to run again."""
        self._stop.set()

    def stopping(self):
        """Reports whether stop() was called."""
        return self._stop.is_set()

    def run(self, handler):
        """Connects to the daemon and calls handler(event) for each event
        received, in frame order, until stop() is called. Returning acks
        the event; raising Permanent nacks it permanently, any other
        Exception retryably. A message that is not a valid events frame is
        logged and counted in stats.malformed, never acknowledged."""
        if handler is None:
            raise ValueError("ingestor_processor: handler is required")
        dd = forget = None
        if self.dedupe_db is not None:
            dd = sqlite3.connect(self.dedupe_db, isolation_level=None, timeout=10.0)
            dd.execute("PRAGMA journal_mode=WAL")
            dd.execute(PROCESSED_SCHEMA)
            forget = _Forgetter(dd, self.dedupe_retention, self.stats)
        cache = _KeyCache(self.dedupe_cache_size)
        try:
            self._serve(lambda f: self._plain_frame(f, handler, dd, cache, forget))
        finally:
            if dd is not None:
                try:
                    forget.save()
                finally:
                    dd.close()

    def run_tx(self, db, handler):
        """Is run with exactly-once effects in a SQLite database: db is its
        path, or a sqlite3.Connection opened with isolation_level=None (see
        open_database). run_tx creates a table processed (source, key,
        processed_at) there. For each frame it begins one transaction and,
        for each event whose (source, key) is not in processed, calls
        handler(conn, event) under a savepoint and inserts the pair into
        processed; it commits and only then acknowledges. An exception
        undoes that event's writes only and nacks it. A redelivery after a
        crash between the commit and the ack finds the key, is skipped and
        acknowledged again (stats.duplicates). The handler must not commit
        or roll back."""
        if handler is None:
            raise ValueError("ingestor_processor: handler is required")
        if self.dedupe_db is not None:
            raise ValueError("ingestor_processor: run_tx keeps processed keys in its own database; dedupe_db must be None")
        own = not isinstance(db, sqlite3.Connection)
        conn = open_database(db) if own else db
        try:
            if conn.isolation_level is not None:
                raise ValueError("ingestor_processor: run_tx needs a connection with isolation_level=None")
            conn.execute(PROCESSED_SCHEMA)
            forget = _Forgetter(conn, self.dedupe_retention, self.stats)
            cache = _KeyCache(self.dedupe_cache_size)
            try:
                self._serve(lambda f: self._tx_frame(f, conn, handler, cache, forget))
            finally:
                forget.save()
        finally:
            if own:
                conn.close()

    # The loop.

    def _serve(self, process):
        if not self._running.acquire(blocking=False):
            raise RuntimeError("ingestor_processor: run is already active on this client")
        try:
            ctx = zmq.Context()
            pull = push = None
            try:
                pull, push = self._connect(ctx)
                self.log.info("processor started: endpoint %s, ack endpoint %s%s", self.endpoint,
                              self.ack_endpoint, ", CURVE" if self._curve else "")
                batch = AckBatch()
                try:
                    self._loop(pull, push, batch, process)
                finally:
                    if not self._flush(push, batch, time.monotonic() + _CLOSE_LINGER):
                        self.log.warning("acks not sent at stop; their events will be redelivered")
                    self.log.info("processor stopped: %s", self.stats)
            finally:
                for sock, linger in ((pull, 0), (push, int(_CLOSE_LINGER * 1000))):
                    if sock is not None:
                        sock.close(linger=linger)
                ctx.term()
        finally:
            self._running.release()

    def _connect(self, ctx):
        pull = ctx.socket(zmq.PULL)
        try:
            pull.setsockopt(zmq.LINGER, 0)  # frames queued at close come back anyway
            pull.setsockopt(zmq.RCVHWM, self.receive_hwm)
            self._secure(pull)
            pull.connect(self.endpoint)
            push = ctx.socket(zmq.PUSH)
        except BaseException:
            pull.close(linger=0)
            raise
        try:
            push.setsockopt(zmq.LINGER, int(_CLOSE_LINGER * 1000))
            self._secure(push)
            push.connect(self.ack_endpoint)
        except BaseException:
            pull.close(linger=0)
            push.close(linger=0)
            raise
        return pull, push

    def _secure(self, sock):
        if self._curve is None:
            return
        server, public, secret = self._curve
        sock.setsockopt(zmq.CURVE_SERVERKEY, server)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, secret)

    def _loop(self, pull, push, batch, process):
        while not self._stop.is_set():
            if not pull.poll(_POLL_INTERVAL, zmq.POLLIN):
                continue
            while not self._stop.is_set():
                try:
                    parts = pull.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                frame = self._decode(parts)
                if frame is None:
                    continue
                r = process(frame)
                if r is not None:
                    batch.add(r)
                if batch.full() or batch.due(self.ack_flush_interval):
                    self._flush(push, batch)
            # Nothing waiting: at low rates each ack leaves as soon as its
            # frame is done, at high rates they are batched.
            self._flush(push, batch)

    def _decode(self, parts):
        try:
            frame = decode_frame(parts) if self.validate_payloads else decode_frame_trusted(parts)
        except MalformedFrame as e:
            self.stats.malformed += 1
            self.log.warning("dropped a malformed frame: %s", e)
            return None
        self.stats.frames += 1
        if frame.delivery > 1:
            self.stats.redeliveries += 1
        return frame

    def _flush(self, push, batch, deadline=None):
        """Sends the batch, waiting while the ack socket is full (the daemon
        is slow or away); after stop() or past deadline it waits at most
        _CLOSE_LINGER. Returns whether the batch was sent (and emptied)."""
        if batch.empty():
            return True
        data = batch.encode()
        while True:
            try:
                push.send(data, zmq.NOBLOCK)
                break
            except zmq.Again:
                pass
            now = time.monotonic()
            if deadline is None and self._stop.is_set():
                deadline = now + _CLOSE_LINGER
            if deadline is not None and now >= deadline:
                return False
            push.poll(_POLL_INTERVAL, zmq.POLLOUT)
        self.stats.acked += batch.events
        batch.reset()
        return True

    # Processing a frame.

    def _nack(self, frame, ev, e):
        self.stats.failed += 1
        permanent = isinstance(e, Permanent)
        if permanent:
            self.stats.permanent += 1
            self.log.warning("handler failed permanently on %s/%s (frame %d, delivery %d); nacked, "
                             "the daemon dead-letters the event: %s", ev.source, ev.key, frame.id, frame.delivery, e)
        else:
            self.log.warning("handler failed on %s/%s (frame %d, delivery %d); nacked, the event will be "
                             "redelivered: %r", ev.source, ev.key, frame.id, frame.delivery, e)
        return (ev.source, ev.key, _reason(e), permanent)

    def _plain_frame(self, frame, handler, dd, cache, forget):
        if forget is not None:
            self._forget(forget)
        done = [False] * len(frame.events)
        nacks, fresh = [], []
        for i, ev in enumerate(frame.events):
            if self._stop.is_set():
                break  # the rest are redelivered
            self.stats.events += 1
            if dd is not None:
                try:
                    seen = cache.has(ev.source, ev.key) or dd.execute(_SELECT_PROCESSED, (ev.source, ev.key)).fetchone()
                except sqlite3.Error as e:
                    self.log.warning("dedupe lookup of %s/%s failed; processing the event: %s", ev.source, ev.key, e)
                    seen = False
                if seen:
                    self.stats.duplicates += 1
                    done[i] = True
                    continue
            try:
                handler(ev)
            except Exception as e:
                nacks.append(self._nack(frame, ev, e))
                continue
            done[i] = True
            fresh.append(ev)
        if dd is not None and fresh:
            # The effects happened: ack them even when the record fails.
            try:
                _with_tx(dd, lambda: dd.executemany(_RECORD_PROCESSED, [(ev.source, ev.key, forget.now()) for ev in fresh]))
                for ev in fresh:
                    cache.add(ev.source, ev.key)
            except sqlite3.Error as e:
                self.log.warning("processed keys of frame %d not recorded; a redelivery will repeat them: %s", frame.id, e)
        return frame_result(frame, done, nacks)

    def _tx_frame(self, frame, conn, handler, cache, forget):
        self._forget(forget)
        done = [False] * len(frame.events)
        todo = []
        for i, ev in enumerate(frame.events):
            if cache.has(ev.source, ev.key):
                self.stats.events += 1
                self.stats.duplicates += 1
                done[i] = True
            else:
                todo.append(i)
        if not todo or self._stop.is_set():
            return frame_result(frame, done, [])
        nacks, fresh = self._apply_tx(frame, conn, handler, todo, done, forget)
        for i in fresh:
            done[i] = True
            cache.add(frame.events[i].source, frame.events[i].key)
        return frame_result(frame, done, nacks)

    def _forget(self, forget):
        """Runs a due retention pass; a failure is logged, never fatal."""
        try:
            forget.maybe()
        except sqlite3.Error as e:
            self.log.warning("forget processed keys past the retention: %s", e)

    def _apply_tx(self, frame, conn, handler, todo, done, forget):
        """Runs the events todo of frame in one transaction, marking those
        found in processed in done. Returns the nacks and the indexes of the
        events committed now."""
        nacks, fresh = [], []
        evs = frame.events
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            for i in todo:
                self.stats.events += 1
                nacks.append(self._nack(frame, evs[i], RuntimeError(f"begin transaction: {e}")))
            return nacks, []

        def fail_all(err):
            for j in fresh:
                nacks.append(self._nack(frame, evs[j], err))
            fresh.clear()

        try:
            for i in todo:
                if self._stop.is_set():
                    break  # the rest are redelivered
                ev = evs[i]
                self.stats.events += 1
                try:
                    seen = conn.execute(_SELECT_PROCESSED, (ev.source, ev.key)).fetchone()
                except sqlite3.Error as e:
                    nacks.append(self._nack(frame, ev, RuntimeError(f"look up processed key: {e}")))
                    continue
                if seen:
                    self.stats.duplicates += 1
                    done[i] = True
                    continue
                try:
                    conn.execute("SAVEPOINT event")
                except sqlite3.Error as e:
                    nacks.append(self._nack(frame, ev, RuntimeError(f"savepoint: {e}")))
                    continue
                try:
                    handler(conn, ev)
                    conn.execute(_INSERT_PROCESSED, (ev.source, ev.key, forget.now()))
                    conn.execute("RELEASE event")
                    fresh.append(i)
                    continue
                except Exception as e:
                    herr = e
                # Undo this event's writes only.
                try:
                    conn.execute("ROLLBACK TO event")
                    conn.execute("RELEASE event")
                except sqlite3.Error as e:
                    rerr = RuntimeError(f"roll back to savepoint: {e}")
                    _rollback(conn)
                    fail_all(rerr)
                    nacks.append(self._nack(frame, ev, herr))
                    return nacks, []
                nacks.append(self._nack(frame, ev, herr))
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as e:
                _rollback(conn)
                fail_all(RuntimeError(f"commit: {e}"))
        except BaseException:
            # KeyboardInterrupt, SystemExit: nothing of this frame commits.
            _rollback(conn)
            raise
        return nacks, fresh


def _rollback(conn):
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error as e:
            log.warning("roll back: %s", e)


def _with_tx(conn, fn):
    """Runs fn in a transaction of conn (isolation_level None)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        fn()
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise
