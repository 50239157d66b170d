"""Which file passes run on threads (ckptaudit.onepass.at_once)."""

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from ckptaudit.onepass import at_once


@pytest.mark.parametrize("size,small", [(0, True), (87_005, True), (at_once.SERIAL_UNIT_BYTES, True),
                                        (at_once.SERIAL_UNIT_BYTES + 1, False), (None, False), (-1, False)])
def test_small_unit_by_inventory_size(size, small, tmp_path):
    assert at_once.small_unit({"unit": "u", "size_bytes": size}, tmp_path) is small


def test_a_remote_unit_keeps_the_threads():
    """Its pass waits on round trips: on threads they overlap."""
    assert not at_once.small_unit({"unit": "u", "size_bytes": 87_005}, "s3://bucket/run")


def test_map_in_order_keeps_order_and_runs_only_the_marked_items_on_threads():
    caller = threading.get_ident()
    ran_on = {}

    def one(x):
        ran_on[x] = threading.get_ident()
        return x * 10

    items = list(range(9))
    on_threads = [x % 3 == 0 for x in items]  # 0, 3, 6
    assert at_once.map_in_order(one, items, on_threads, workers=4) == [x * 10 for x in items]
    assert {x for x in items if ran_on[x] == caller} == {1, 2, 4, 5, 7, 8}
    assert all(ran_on[x] != caller for x in (0, 3, 6))


def test_map_in_order_with_one_threaded_item_runs_everything_here():
    caller = threading.get_ident()
    got = at_once.map_in_order(lambda x: (x, threading.get_ident()), [1, 2, 3], [False, True, False], workers=4)
    assert got == [(1, caller), (2, caller), (3, caller)]


def test_map_in_order_raises_a_threaded_items_error():
    def one(x):
        if x == 2:
            raise OSError("gone")
        return x

    with pytest.raises(OSError, match="gone"):
        at_once.map_in_order(one, [1, 2, 3, 4], [True, True, False, True], workers=2)


def test_pass_slots_count_the_passes_in_flight_and_spread_follows_them():
    slots = at_once.PassSlots(3)
    assert slots.in_flight == 0
    with slots:
        assert slots.in_flight == 1
        with slots:
            assert slots.in_flight == 2
        assert slots.in_flight == 1
    assert slots.in_flight == 0
    with pytest.raises(ZeroDivisionError):
        with slots:
            1 / 0
    assert slots.in_flight == 0  # released on an error too
    with at_once.PASS_SLOTS:
        assert at_once.spread(2) and not at_once.spread(1)
        with at_once.PASS_SLOTS:
            assert not at_once.spread(2) and at_once.spread(3)


@pytest.mark.parametrize("busy", [False, True])
def test_a_pass_feeds_its_digest_beside_the_rest_only_while_a_core_would_idle(tmp_path, busy):
    """One pass in flight on two cores: the SHA-256 of each buffer on the pool's thread; two: on the reading
    thread in turn with the CRC32 and value consumers. The same digest either way."""
    import hashlib

    from ckptaudit.onepass import stream
    from ckptaudit.onepass.consumers import Sha256

    data = bytes(range(256)) * (3 * (stream.BUFFER_BYTES // 256) + 7)  # four buffers, the last short
    p = tmp_path / "f.bin"
    p.write_bytes(data)
    reader, fed_on = threading.get_ident(), set()

    class Seen(Sha256):
        def feed(self, off, view):
            fed_on.add(threading.get_ident())
            super().feed(off, view)

    class Count:  # a consumer fed on the reading thread
        n = 0

        def feed(self, off, view):
            Count.n += len(view)

    sha = Seen()
    with at_once.PASS_SLOTS:
        with at_once.PASS_SLOTS if busy else contextlib.nullcontext(), ThreadPoolExecutor(2) as pool:
            n = stream.run(p, [sha, Count()], pool=pool, spread=lambda: at_once.spread(2))
    assert n == Count.n == len(data) and sha.hexdigest() == hashlib.sha256(data).hexdigest()
    assert fed_on == {reader} if busy else (fed_on and reader not in fed_on)
