"""GcPauses: every collection counted and timed by generation through gc.callbacks, between two reports."""

from __future__ import annotations

import gc

from vllm_voxserve.gc_pauses import GcPauses, process_gc_pauses


def test_collections_are_counted_and_timed_by_generation():
    ticks = iter(range(100))
    pauses = GcPauses(clock=lambda: next(ticks) / 1000.0)  # each callback 1 ms after the one before
    pauses._on_gc("start", {"generation": 0})
    pauses._on_gc("stop", {"generation": 0, "collected": 3})
    pauses._on_gc("start", {"generation": 2})
    pauses._on_gc("stop", {"generation": 2, "collected": 0})
    pauses._on_gc("start", {"generation": 0})
    pauses._on_gc("stop", {"generation": 0, "collected": 0})
    assert pauses.report() == ("gen0 2 (2.0 ms total, max 1.00 ms); gen2 1 (1.0 ms total, max 1.00 ms)")
    assert pauses.report() == "none"  # each report covers the collections since the last


def test_installed_it_sees_a_real_collection_and_uninstalled_nothing():
    pauses = GcPauses().install()
    try:
        pauses.install()  # once only
        assert gc.callbacks.count(pauses._on_gc) == 1
        gc.collect(1)
        assert pauses.report().startswith("gen1 1 (")
    finally:
        pauses.uninstall()
    gc.collect(1)
    assert pauses.report() == "none"


def test_the_process_has_one_instance():
    assert process_gc_pauses() is process_gc_pauses()
    assert gc.callbacks.count(process_gc_pauses()._on_gc) == 1
