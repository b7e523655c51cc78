"""The message format of PROTOCOL.md, version 1: strict decoding of events
frames and encoding of acks."""

import base64
import binascii
import json

VERSION = 1

# MAX_REASON_BYTES is how much of a nack's reason the daemon keeps.
MAX_REASON_BYTES = 1024

_MAX_INT64 = 2**63 - 1


class MalformedFrame(ValueError):
    """A message that is not a valid version 1 events frame. It is never
    acknowledged."""


class Event:
    """One event as the daemon delivers it. (source, key) identifies it.

    The event's bytes are in exactly one of two forms: when is_json is true,
    payload holds the parsed JSON value (None for JSON null); otherwise
    payload_bytes holds the bytes of payload_b64 and payload is None. A
    frame decoded trusting the daemon (decode_frame_trusted) holds each
    JSON payload's bytes unparsed: payload parses them when first read,
    raising MalformedFrame if they are not JSON, and data() returns them
    as they are.
    fetched_at and event_time are RFC 3339 strings as sent; event_time is
    None when the source did not know one. traceparent and tracestate are
    the W3C trace context of an event the daemon traced, else None:
    trace_context() hands them to opentelemetry.propagate.extract.
    """

    __slots__ = ("key", "source", "seq", "fetched_at", "event_time",
                 "raw_key", "raw_off", "raw_len", "is_json", "_payload", "_payload_json", "payload_bytes",
                 "traceparent", "tracestate")

    def __init__(self, key, source, seq, fetched_at=None, event_time=None, raw_key=None,
                 raw_off=None, raw_len=None, is_json=True, payload=None, payload_bytes=None):
        self.key = key
        self.source = source
        self.seq = seq
        self.fetched_at = fetched_at
        self.event_time = event_time
        self.raw_key = raw_key
        self.raw_off = raw_off
        self.raw_len = raw_len
        self.is_json = is_json
        self._payload = payload
        # _payload_json holds the JSON text of a payload not parsed yet, or
        # of one parsed from it; None otherwise.
        self._payload_json = None
        self.payload_bytes = payload_bytes
        self.traceparent = None
        self.tracestate = None

    @property
    def payload(self):
        if self._payload_json is not None and self._payload is _UNPARSED:
            try:
                self._payload = json.loads(self._payload_json.decode("utf-8"), parse_constant=_reject_constant)
            except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                raise MalformedFrame(f"event {self.source}/{self.key}: payload is not JSON: {e}") from None
        return self._payload

    @payload.setter
    def payload(self, value):
        self._payload, self._payload_json = value, None

    def trace_context(self):
        """Returns the event's trace context as a carrier dict for
        opentelemetry.propagate.extract ({} when the event is not traced):

            ctx = opentelemetry.propagate.extract(event.trace_context())
            with tracer.start_as_current_span("handle", context=ctx): ...
        """
        carrier = {}
        if self.traceparent is not None:
            carrier["traceparent"] = self.traceparent
            if self.tracestate is not None:
                carrier["tracestate"] = self.tracestate
        return carrier

    def data(self):
        """Returns the event's bytes: the payload_b64 bytes, or the JSON
        payload re-encoded compactly (the same value, not necessarily the
        upstream's exact bytes, which the raw store holds)."""
        if not self.is_json:
            return self.payload_bytes
        if self._payload_json is not None:
            return self._payload_json
        return json.dumps(self.payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    def __repr__(self):
        return f"Event(source={self.source!r}, key={self.key!r}, seq={self.seq!r})"


# _UNPARSED is the payload of an event whose JSON text is not parsed yet.
_UNPARSED = object()


def _lazy_event(ev, text):
    """Makes ev's payload the JSON text (bytes), parsed when read."""
    ev._payload, ev._payload_json = _UNPARSED, text
    return ev


class Frame:
    """One events frame: its id, delivery number, raw store and events."""

    __slots__ = ("id", "delivery", "raw_store", "events")

    def __init__(self, id, delivery, raw_store, events):
        self.id = id
        self.delivery = delivery
        self.raw_store = raw_store
        self.events = events


def _reject_constant(name):
    raise MalformedFrame(f"{name} is not JSON")


def _is_int(v):
    # type() rejects bool (an int subclass in Python); floats such as 1.0
    # and 1e3 are not ints.
    return type(v) is int


def _utf8_str(v):
    """Reports whether v is a str that encodes to UTF-8: a JSON escape of a
    lone surrogate decodes to a str that does not, and could not be echoed
    back in an ack as it was sent."""
    if type(v) is not str:
        return False
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def decode_frame(parts):
    """Returns the Frame in parts, the list of parts of one ZeroMQ message,
    or raises MalformedFrame.

    It accepts exactly what PROTOCOL.md defines: a single-part message whose
    body is one UTF-8 JSON object without a byte-order mark, v the integer 1,
    type "events", a frame id from 1 to 2^63-1 and an events array of objects
    each with a string key and source, an integer seq and exactly one of
    payload and payload_b64 (standard base64 with padding). Unknown fields
    are ignored at every level. A frame of which any part does not decode is
    rejected whole, as the Go client does.
    """
    return _frame(_loads(_body(parts)))


def decode_frame_trusted(parts):
    """decode_frame for a frame from the daemon, which validated every
    payload before it queued it (PROTOCOL.md, "What a processor may rely
    on"): in the layout the daemon writes, each JSON payload is taken by
    its length, raw.len, without being parsed; Event.payload parses it when
    first read, and Event.data() returns it as it came. Everything else of
    the frame is checked as decode_frame checks it. A frame laid out
    otherwise, or whose lengths do not fit what follows them, is decoded
    by decode_frame; a raw.len that lies and still fits can hand a handler
    a wrong payload: trust only the daemon's frames so.
    """
    body = _body(parts)
    cut = _skeleton(body)
    if cut is not None:
        try:
            return _frame(_loads(cut[0]), cut[1])
        except MalformedFrame:
            pass  # decode_frame says why, or takes it as it is
    return _frame(_loads(body))


# The daemon's layout (internal/wire's Encoder): the frame's members, then
# the events, each ending with its raw object and its payload.
_EVENTS = b',"events":['
_EVENT = b'{"key":'
_PAYLOAD = b',"payload'
_RAW_LEN = b',"len":'
_OPEN, _CLOSE, _COMMA, _BRACKET = ord("{"), ord("}"), ord(","), ord("]")


def _skeleton(body):
    """Returns body with each JSON payload replaced by null, and the
    payloads' JSON text (None for a payload_b64), when body is laid out as
    the daemon lays out frames and every payload's raw.len fits; else None.

    A payload's member is found as the event's first ',"payload': in valid
    JSON those bytes can only be a member name, since a quote after a comma
    cannot be inside a string, and the members before it (key, source,
    seq, times, trace context, raw) have other names.
    """
    start = body.find(_EVENTS)
    if start < 0 or not body.startswith(b'{"v":'):
        return None
    pos = start + len(_EVENTS)
    pieces, raws = [body[:pos]], []
    if body[pos:] == b"]}":
        return body, raws
    while body.startswith(_EVENT, pos):
        p = body.find(_PAYLOAD, pos)
        if p < 0:
            return None
        value = p + len(_PAYLOAD)
        if body.startswith(b'":', value):  # JSON, taken by raw.len
            value += 2
            j = body.rfind(_RAW_LEN, pos, p)
            if j < 0 or body[p - 1] != _CLOSE:
                return None
            try:
                end = value + int(body[j + len(_RAW_LEN):p - 1])
            except ValueError:
                return None
            if end >= len(body) - 1 or end <= value or body[end] != _CLOSE or \
                    body[end + 1] not in (_COMMA, _BRACKET) or not _plausible(body[value:end]):
                return None
            pieces.append(body[pos:value])
            pieces.append(b"null}")
            raws.append(body[value:end])
        elif body.startswith(b'_b64":"', value):  # a base64 string: no quote inside
            end = body.find(b'"', value + 7) + 1
            if end <= 0 or end >= len(body) - 1 or body[end] != _CLOSE or body[end + 1] not in (_COMMA, _BRACKET):
                return None
            pieces.append(body[pos:end + 1])
            raws.append(None)
        else:
            return None
        pos = end + 1
        if body[pos] == _BRACKET:
            if body[pos:] != b"]}":
                return None
            pieces.append(b"]}")
            return b"".join(pieces), raws
        pieces.append(b",")
        pos += 1
    return None


def _plausible(val):
    """Reports whether val starts and ends as a JSON value can: a cheap
    check that a payload taken by its length was not cut short or run on,
    as the Go client's."""
    first, last = val[:1], val[-1:]
    if first == b"{":
        return last == b"}"
    if first == b"[":
        return last == b"]"
    if first == b'"':
        n = len(val) - 2 - len(val[1:-1].rstrip(b"\\"))
        return len(val) > 1 and last == b'"' and n % 2 == 0
    if first in (b"t", b"n", b"f"):
        return last in (b"e", b"l")
    return (first == b"-" or first.isdigit()) and last.isdigit()


def _body(parts):
    """Returns the bytes of a single-part message, or raises MalformedFrame."""
    if len(parts) != 1:
        raise MalformedFrame(f"want a single-part message, got {len(parts)} parts")
    body = parts[0]
    if isinstance(body, memoryview):
        body = body.tobytes()
    return body


def _loads(body):
    """Parses body, JSON text in UTF-8 without a byte-order mark, or raises
    MalformedFrame."""
    try:
        # Decoding to str first makes json.loads reject a byte-order mark,
        # which it would skip in bytes.
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MalformedFrame(f"not valid UTF-8: {e}") from None
    try:
        msg = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        # Deeper than Python's recursion limit: never acked, so the frame
        # comes back until the daemon's max_deliveries dead-letters it.
        raise MalformedFrame("nested too deeply for this parser") from None
    except json.JSONDecodeError as e:
        raise MalformedFrame(f"not JSON: {e}") from None
    return msg


def _frame(msg, raws=None):
    """Returns the Frame of msg, the parsed message, or raises
    MalformedFrame. raws, from decode_frame_trusted, holds the JSON text of
    each event's payload taken by its length (None for a payload_b64), its
    place in msg held by null."""
    if type(msg) is not dict:
        raise MalformedFrame(f"not a JSON object but {type(msg).__name__}")
    v = msg.get("v")
    if not _is_int(v) or v != VERSION:
        raise MalformedFrame(f"unsupported version {v!r} (want {VERSION})")
    if msg.get("type") != "events":
        raise MalformedFrame(f"not an events frame: type {msg.get('type')!r}")
    fid = msg.get("frame")
    if not _is_int(fid) or not 1 <= fid <= _MAX_INT64:
        raise MalformedFrame(f"field frame: want an integer from 1 to 2^63-1, found {fid!r}")
    delivery = msg.get("delivery", 1)
    if not _is_int(delivery):
        raise MalformedFrame(f"field delivery: want an integer, found {delivery!r}")
    raw_store = msg.get("raw_store", "")
    if type(raw_store) is not str:
        raise MalformedFrame("field raw_store: want a string")
    evs = msg.get("events")
    if type(evs) is not list:
        raise MalformedFrame("field events: want an array")
    if raws is None:
        return Frame(fid, delivery, raw_store, [_decode_event(i, ev) for i, ev in enumerate(evs)])
    if len(raws) != len(evs):
        raise MalformedFrame("events: not as laid out by the daemon")
    out = [_decode_event(i, ev) for i, ev in enumerate(evs)]
    for ev, raw in zip(out, raws):
        if raw is not None:
            _lazy_event(ev, raw)
    return Frame(fid, delivery, raw_store, out)


def _decode_event(i, ev):
    where = f"events[{i}]"
    if type(ev) is not dict:
        raise MalformedFrame(f"{where}: want an object")
    key, source, seq = ev.get("key"), ev.get("source"), ev.get("seq")
    if not _utf8_str(key):
        raise MalformedFrame(f"{where}.key: want a UTF-8 string")
    if not _utf8_str(source):
        raise MalformedFrame(f"{where}.source: want a UTF-8 string")
    if not _is_int(seq) or not -_MAX_INT64 - 1 <= seq <= _MAX_INT64:
        raise MalformedFrame(f"{where}.seq: want a 64-bit integer")
    fetched_at, event_time = ev.get("fetched_at"), ev.get("event_time")
    if fetched_at is not None and type(fetched_at) is not str:
        raise MalformedFrame(f"{where}.fetched_at: want a string")
    if event_time is not None and type(event_time) is not str:
        raise MalformedFrame(f"{where}.event_time: want a string")
    raw = ev.get("raw")
    raw_key = raw_off = raw_len = None
    if raw is not None:
        if type(raw) is not dict:
            raise MalformedFrame(f"{where}.raw: want an object")
        raw_key, raw_off, raw_len = raw.get("key"), raw.get("off"), raw.get("len")
        if (raw_key is not None and type(raw_key) is not str) or \
                (raw_off is not None and not _is_int(raw_off)) or (raw_len is not None and not _is_int(raw_len)):
            raise MalformedFrame(f"{where}.raw: want a string key and integer off and len")
    traceparent, tracestate = ev.get("traceparent"), ev.get("tracestate")
    if (traceparent is not None and type(traceparent) is not str) or (tracestate is not None and type(tracestate) is not str):
        raise MalformedFrame(f"{where}: want string traceparent and tracestate")
    has_json, has_b64 = "payload" in ev, "payload_b64" in ev
    if has_json == has_b64:
        raise MalformedFrame(f"{where}: want exactly one of payload and payload_b64")
    if has_json:
        out = Event(key, source, seq, fetched_at, event_time, raw_key, raw_off, raw_len,
                    is_json=True, payload=ev["payload"])
    else:
        b64 = ev["payload_b64"]
        if type(b64) is not str:
            raise MalformedFrame(f"{where}.payload_b64: want a string")
        try:
            data = base64.b64decode(b64.encode("ascii"), validate=True)
        except (UnicodeEncodeError, binascii.Error) as e:
            raise MalformedFrame(f"{where}.payload_b64: not standard base64: {e}") from None
        out = Event(key, source, seq, fetched_at, event_time, raw_key, raw_off, raw_len,
                    is_json=False, payload_bytes=data)
    out.traceparent, out.tracestate = traceparent, tracestate
    return out


def cut_reason(reason):
    """Returns reason cut to MAX_REASON_BYTES of UTF-8, at a character
    boundary; characters that cannot be encoded become '?'."""
    b = reason.encode("utf-8", "replace")
    if len(b) <= MAX_REASON_BYTES:
        return b.decode("utf-8")
    return b[:MAX_REASON_BYTES].decode("utf-8", "ignore")


def encode_ack(frames=(), keys=(), nacks=()):
    """Returns an ack message: frames, a list of frame ids acked whole;
    keys, a list of (frame, source, key); nacks, a list of (frame, source,
    key, reason, permanent). Empty lists are left out; at least one must be
    non-empty."""
    if not frames and not keys and not nacks:
        raise ValueError("an ack needs at least one frame, key or nack")
    msg = {"v": VERSION, "type": "ack"}
    if frames:
        msg["frames"] = list(frames)
    if keys:
        msg["keys"] = [{"frame": f, "source": s, "key": k} for f, s, k in keys]
    if nacks:
        out = []
        for f, s, k, reason, permanent in nacks:
            n = {"frame": f, "source": s, "key": k, "reason": cut_reason(reason)}
            if permanent:
                n["permanent"] = True
            out.append(n)
        msg["nacks"] = out
    return json.dumps(msg, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
