"""The remote I/O counters: bytes, ranged GETs and request rounds this process spent on object data.

One set of counters per process, held here and nowhere else: :func:`count` adds to them (the
counted fetcher of :func:`ckptaudit.fs.remote.open_object` and :func:`ckptaudit.fs.reads.read_ranges`),
:func:`bytes_read`, :func:`gets_issued` and :func:`round_trips` read them, :func:`reset_bytes_read`
zeroes them.  Each is split by purpose: "ranged" (small reads of headers, directories, pickles) or
"streamed" (whole-object passes).  Listings and HEADs are not counted.

Local reads of audited files are counted apart (:func:`count_local`, :func:`local_bytes_read`): every
byte the OS hands to a file opened with :func:`ckptaudit.fs.reads.open_binary` or read with
:func:`ckptaudit.fs.reads.pread`, so a stage can say what it read (:func:`stage_bytes`).
"""

from __future__ import annotations

import threading
from typing import Dict

_lock = threading.Lock()
_bytes: Dict[str, int] = {"ranged": 0, "streamed": 0}
_gets: Dict[str, int] = {"ranged": 0, "streamed": 0}
_rounds: Dict[str, int] = {"ranged": 0, "streamed": 0}
_local: Dict[str, int] = {"bytes": 0}


def count(purpose: str, nbytes: int, gets: int = 1) -> None:
    """Add ``nbytes`` fetched by ``gets`` GETs issued in one round to the ``purpose`` counters."""
    with _lock:
        _bytes[purpose] += nbytes
        _gets[purpose] += gets
        _rounds[purpose] += 1


class Counted:
    """A fetcher ``(start, end) -> bytes`` that counts every call as one GET in one round."""

    def __init__(self, fetch, purpose: str):
        self.fetch, self.purpose = fetch, purpose

    def __call__(self, start, end):
        data = self.fetch(start, end)
        count(self.purpose, len(data))
        return data


def bytes_read(purpose: str = "") -> int:
    """Remote bytes fetched by this process so far: all, or only "ranged" (small reads of
    headers, directories, pickles) or "streamed" (whole-object passes)."""
    return _bytes[purpose] if purpose else sum(_bytes.values())


def gets_issued(purpose: str = "") -> int:
    """Ranged GET requests this process issued for object data so far (all, "ranged" or
    "streamed", as :func:`bytes_read`); listings and HEADs are not counted."""
    return _gets[purpose] if purpose else sum(_gets.values())


def round_trips(purpose: str = "") -> int:
    """Sequential request rounds behind :func:`gets_issued`: one per single GET, one per
    :func:`read_ranges` batch (whose GETs run concurrently).  What latency multiplies."""
    return _rounds[purpose] if purpose else sum(_rounds.values())


def count_local(nbytes: int) -> None:
    """Add ``nbytes`` read from a local audited file."""
    with _lock:
        _local["bytes"] += nbytes


def local_bytes_read() -> int:
    """Bytes this process read from local audited files so far (see :func:`count_local`)."""
    return _local["bytes"]


def stage_bytes() -> Dict[str, int]:
    """A snapshot of every byte counter: ``local``, ``remote_ranged``, ``remote_streamed`` (bytes)."""
    return {"local": _local["bytes"], "remote_ranged": _bytes["ranged"], "remote_streamed": _bytes["streamed"]}


def reset_bytes_read() -> None:
    """Zero :func:`bytes_read`, :func:`gets_issued` and :func:`round_trips`."""
    with _lock:
        for k in _bytes:
            _bytes[k] = 0
            _gets[k] = 0
            _rounds[k] = 0
