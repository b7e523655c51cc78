"""Keep the C allocator from giving ZeroMQ's message buffers back after each burst.

libzmq allocates every message it receives with malloc (a frame of 100
events of 500 B is ~75 KB) and it is freed on another thread. With glibc's
defaults a burst of such frees trims the heap (madvise, a TLB flush on every
core) and the next burst faults the same pages in again. tune_malloc raises
glibc's trim and mmap thresholds, as the daemon and the Go example processor
do at start (docs/performance.md, "The C allocator"). It changes the whole
process, so the library never calls it by itself: the example command does,
and a processor of your own may.
"""

import ctypes
import ctypes.util
import os

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

TRIM_THRESHOLD = 64 << 20
"""How much free memory may sit at the top of a heap before glibc gives it back."""

MMAP_THRESHOLD = 32 << 20
"""The size from which an allocation gets its own mapping (glibc's largest)."""


def tune_malloc(tunables=None):
    """Raise glibc's malloc thresholds; return (applied, reason).

    Nothing changes when GLIBC_TUNABLES (or tunables, when given) sets
    either threshold, or when the C library is not glibc.
    """
    if tunables is None:
        tunables = os.environ.get("GLIBC_TUNABLES", "")
    if "malloc.trim_threshold" in tunables or "malloc.mmap_threshold" in tunables:
        return False, "GLIBC_TUNABLES sets a malloc threshold: kept"
    name = ctypes.util.find_library("c")
    if not name:
        return False, "no C library found"
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # only glibc has it
    except (OSError, AttributeError):
        return False, "not glibc"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1 or mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
        return False, "mallopt refused the thresholds"
    return True, ""
