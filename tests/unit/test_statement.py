"""The cycle's statement: a discard takes back every write made through it since its
checkpoint, last first; a commit keeps them."""

from __future__ import annotations

from typing import Any

import numpy as np

from batchsched.core.plan import Plan, UnitResult, UnitStatus
from batchsched.core.queues import QueueName, QueueTree
from batchsched.core.statement import Statement

COLUMNS = ("cpu", "memory", "pods", "nvidia.com/gpu")


def queue(name: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "batchsched.io/v1alpha1", "kind": "Queue", "metadata": {"name": name},
        "spec": {"resources": [{"name": "nvidia.com/gpu", "nominal": gpus}]},
    }


def statement() -> Statement:
    alloc = np.tile(np.array([8000, 64 << 30, 110, 8], dtype=np.int64), (3, 1))
    used = np.zeros_like(alloc)
    used[1] = [1000, 1 << 30, 1, 2]
    tree = QueueTree.from_objects([queue("a", 8)], COLUMNS)
    return Statement(alloc, used, tree, Plan())


def gpus(n: int) -> np.ndarray:  # type: ignore[type-arg]
    return np.array([[0, 0, 1, n]], dtype=np.int64)


def test_a_discard_takes_back_charges_holds_and_results_in_reverse() -> None:
    st = statement()
    before = st.used.copy()
    mark = st.checkpoint()
    st.charge(QueueName("a"), [0], gpus(4), 1)
    st.hold(np.array([2], dtype=np.intp), gpus(2))
    st.record("u", UnitResult(UnitStatus.WAITING, "Reserved", "held"))
    assert st.tree.usage_vector(QueueName("a"))[3] == 4
    assert st.trying
    st.discard(mark)
    assert not st.trying
    assert (st.used == before).all()
    assert st.tree.usage_vector(QueueName("a"))[3] == 0
    assert st.plan.results == {}


def test_a_commit_keeps_the_writes_and_an_enclosing_discard_still_takes_them_back() -> None:
    st = statement()
    before = st.used.copy()
    outer = st.checkpoint()
    inner = st.checkpoint()
    st.charge(None, [0], gpus(3), 1)
    st.commit(inner)
    assert st.used[0, 3] == 3
    st.discard(outer)
    assert (st.used == before).all()
    mark = st.checkpoint()
    st.charge(None, [0], gpus(3), 1)
    st.commit(mark)
    st.discard(st.checkpoint())  # nothing since: nothing taken back
    assert st.used[0, 3] == 3


def test_a_what_if_usage_and_what_a_kernel_placed_on_it_are_discarded() -> None:
    st = statement()
    before = st.used.copy()
    mark = st.checkpoint()
    st.assume(np.zeros_like(st.used))
    st.used[1] += gpus(8)[0]  # as a kernel writes it, in place
    st.placed([1], gpus(8))
    st.discard(mark)
    assert (st.used == before).all()


def test_an_eviction_takes_the_victim_out_of_the_usage_until_it_is_gone() -> None:
    st = statement()
    st.evict("train", None, [("uid-1", 1, np.array([1000, 1 << 30, 1, 2], dtype=np.int64))])
    assert not st.used[1].any()
    assert st.gone.remaining()
    assert st.evicted == {"train": 1}
    with st.victims_room_closed():
        assert st.used[1, 3] == 2
    assert st.used[1, 3] == 0
