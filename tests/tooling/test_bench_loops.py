"""The benchmarks' loop names: the three built in, the peer loops on PyPI
("peers", "all"), "<patcher>+<loop>" and any module with new_event_loop; a
loop that is not installed is reported with its import error, not measured."""
import asyncio
import sys
import types

import pytest

from tideloop._bench import harness


def test_all_and_peers_expand_in_order_without_repeats():
    assert harness.expand_loops("all") == list(harness.ALL_LOOPS + harness.PEER_LOOPS)
    assert harness.expand_loops("tideloop,peers,tideloop") == \
        ["tideloop", *harness.PEER_LOOPS]
    assert harness.expand_loops(" , ") == []


def test_any_module_with_new_event_loop_is_a_loop(monkeypatch):
    mod = types.ModuleType("fake_peer_loop")
    mod.new_event_loop = asyncio.SelectorEventLoop
    mod.other_factory = asyncio.SelectorEventLoop
    monkeypatch.setitem(sys.modules, "fake_peer_loop", mod)
    spec = harness.load_loop("fake_peer_loop")
    assert spec.error is None and spec.factory is asyncio.SelectorEventLoop
    assert spec.info.startswith("fake_peer_loop ")
    assert harness.load_loop("fake_peer_loop:other_factory").factory is mod.other_factory
    assert harness.run_on_loop("fake_peer_loop", asyncio.sleep, 0, 7) == 7


def test_a_missing_peer_says_why():
    spec = harness.load_loop("no_such_loop_module_xyz")
    assert spec.factory is None
    assert "ModuleNotFoundError" in spec.error and "no_such_loop_module_xyz" in spec.error


@pytest.mark.parametrize("name", ["../evil", "a b", "nosuchpatcher+asyncio"])
def test_names_that_are_not_modules_are_refused(name):
    spec = harness.load_loop(name)
    assert spec.factory is None and "ValueError" in spec.error


def test_a_patcher_wraps_the_base_loop(monkeypatch):
    made = []

    def patch(base):
        def factory():
            loop = base()
            made.append(loop)
            return loop
        return factory

    monkeypatch.setitem(harness.PATCHERS, "fakepatch", patch)
    assert harness.run_on_loop("fakepatch+asyncio", asyncio.sleep, 0, 3) == 3
    assert len(made) == 1 and isinstance(made[0], asyncio.SelectorEventLoop)
