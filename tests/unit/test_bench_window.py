"""bench/window.py's frozen_heap: the harness's own objects are out of the collector's sight
while a row is measured, and back in it afterwards (also when the row fails)."""

import gc

import pytest

from bench.window import frozen_heap


def test_frozen_while_measuring_and_unfrozen_after():
    assert gc.get_freeze_count() == 0
    with frozen_heap():
        assert gc.get_freeze_count() > 1000  # the interpreter's modules and functions at least
    assert gc.get_freeze_count() == 0


def test_unfrozen_after_a_row_that_raises():
    with pytest.raises(RuntimeError):
        with frozen_heap():
            raise RuntimeError("row failed")
    assert gc.get_freeze_count() == 0
