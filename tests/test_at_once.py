"""Which file passes run on threads (ckptaudit.onepass.at_once)."""

import threading

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
