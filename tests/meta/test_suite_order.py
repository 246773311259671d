"""The suite's file order (tests/suite_order.py) and that xdist's scheduler honours it."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from xdist.scheduler import LoadFileScheduling

from tests import suite_order


def _item(nodeid: str, slow: bool = False) -> SimpleNamespace:
    return SimpleNamespace(nodeid=nodeid,
                           get_closest_marker=lambda name: object() if slow else None)


def test_the_slowest_files_come_first_each_kept_whole_in_its_own_order() -> None:
    items = [_item("a.py::t1"), _item("b.py::t1"), _item("a.py::t2"), _item("c.py::t1"),
             _item("new.py::t1", slow=True), _item("new2.py::t1")]
    suite_order.slowest_files_first(items, {"a.py": 1.0, "b.py": 30.0, "c.py": 0.5})
    # new.py: one slow test, estimated 10 s; new2.py one fast test, 0.2 s.
    assert [i.nodeid for i in items] == ["b.py::t1", "new.py::t1", "a.py::t1", "a.py::t2",
                                         "c.py::t1", "new2.py::t1"]


class _Node:
    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.append(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def test_xdist_loadfile_without_reorder_hands_out_files_in_collection_order() -> None:
    """What ``./dev test`` relies on (``--dist loadfile --no-loadscope-reorder``): the first
    files each worker gets are the first collected, not the ones with the most tests."""
    collection = ["slow.py::t1", *(f"many.py::t{i}" for i in range(20)), "mid.py::t1",
                  "mid.py::t2"]
    config = SimpleNamespace(getvalue=lambda name: ["2*popen"] if name == "tx" else None,
                             option=SimpleNamespace(loadscopereorder=False))
    sched = LoadFileScheduling(config)  # type: ignore[arg-type]
    nodes = [_Node("gw0"), _Node("gw1")]
    for node in nodes:
        sched.add_node(node)  # type: ignore[arg-type]
        sched.add_node_collection(node, collection)  # type: ignore[arg-type]
    sched.schedule()
    first = [collection[n.sent[0][0]].split("::")[0] for n in nodes]
    assert first == ["slow.py", "many.py"]


def test_durations_json_names_files_that_exist() -> None:
    if not suite_order.DURATIONS.exists():
        pytest.skip("no tests/durations.json: every file is estimated (tests/suite_order.py)")
    durations = json.loads(suite_order.DURATIONS.read_text("utf-8"))
    root = suite_order.DURATIONS.parents[1]
    missing = [f for f in durations if not (root / f).exists()]
    assert len(missing) <= len(durations) // 10, missing  # a few renamed files are harmless
