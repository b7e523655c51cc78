"""Batching of acks and nacks into ack messages, within PROTOCOL.md's
limits."""

import time

from .wire import cut_reason, encode_ack

# MAX_BATCH_FRAMES is the most frames, acked whole or in part, one ack
# message holds.
MAX_BATCH_FRAMES = 256
# MAX_BATCH_KEYS is the most single-event acks and nacks one ack message
# holds.
MAX_BATCH_KEYS = 4096
# MAX_BATCH_BYTES is about the most bytes of keys, sources and reasons one
# ack message holds: with the entries of the frame that crossed it, an ack
# stays far below the daemon's smallest message limit (1 MiB) and its
# 16384 entries.
MAX_BATCH_BYTES = 512 << 10
# _ENTRY_BYTES is about the JSON of a key ack or nack besides its strings.
_ENTRY_BYTES = 64


def _size(s):
    """Returns the length of s in UTF-8."""
    return len(s) if s.isascii() else len(s.encode("utf-8", "replace"))


class FrameResult:
    """What processing one frame came to: whole (every event succeeded) or
    the keys that succeeded, and the nacks, as (source, key, reason,
    permanent)."""

    __slots__ = ("id", "n", "whole", "keys", "nacks")

    def __init__(self, id, n, whole, keys=(), nacks=()):
        self.id = id
        self.n = n
        self.whole = whole
        self.keys = list(keys)
        self.nacks = list(nacks)


def frame_result(frame, done, nacks):
    """Returns the FrameResult of frame, given done, one bool per event, and
    the nacks."""
    if all(done):
        return FrameResult(frame.id, len(frame.events), True, nacks=nacks)
    keys = [(ev.source, ev.key) for ev, d in zip(frame.events, done) if d]
    return FrameResult(frame.id, len(frame.events), False, keys, nacks)


class AckBatch:
    """Acks and nacks collected until they are sent as one message."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self.reset()

    def reset(self):
        self.frames = []
        self.keys = []   # (frame, source, key)
        self.nacks = []  # (frame, source, key, reason, permanent)
        self._key_frames = self._nack_frames = 0
        self.events = 0  # events acknowledged
        self.bytes = 0   # estimate of the strings of keys and nacks
        self.since = None  # when the oldest entry was added

    def empty(self):
        return not self.frames and not self.keys and not self.nacks

    def _touch(self):
        if self.empty():
            self.since = self._clock()

    def add(self, r):
        """Adds the FrameResult r."""
        self._touch()
        if r.whole:
            self.frames.append(r.id)
            self.events += r.n
        elif r.keys:
            self._key_frames += 1
            for source, key in r.keys:
                self.keys.append((r.id, source, key))
                self.bytes += _ENTRY_BYTES + _size(source) + _size(key)
            self.events += len(r.keys)
        if r.nacks:
            self._nack_frames += 1
            for source, key, reason, permanent in r.nacks:
                reason = cut_reason(reason)
                self.nacks.append((r.id, source, key, reason, permanent))
                self.bytes += _ENTRY_BYTES + _size(source) + _size(key) + _size(reason)

    def frame_count(self):
        """Returns the number of frames acked, whole or in part."""
        return len(self.frames) + self._key_frames + self._nack_frames

    def full(self):
        """Reports whether the batch must be sent before another frame is
        added."""
        return (self.frame_count() >= MAX_BATCH_FRAMES or len(self.keys) + len(self.nacks) >= MAX_BATCH_KEYS
                or self.bytes >= MAX_BATCH_BYTES)

    def due(self, interval):
        """Reports whether the oldest entry has waited interval seconds."""
        return not self.empty() and self._clock() - self.since >= interval

    def encode(self):
        """Returns the batch as an ack message."""
        return encode_ack(self.frames, self.keys, self.nacks)
