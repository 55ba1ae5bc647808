"""When the first Binding goes out, when one cycle hands the binder N pods whose claims it
must write first (the in-memory FakeKube answering each request after 1 ms).

``PYTHONPATH=<worktree> python perf/reports/2026-11-26-dra-extended/binder_order.py 1000``
prints, for pods with a template's claim (claim status, Binding) and for pods whose
``nvidia.com/gpu`` is served by DRA (claim made, claim status, pod status, Binding), how many
requests went out before the first Binding.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from batchsched.core.plan import Binding, ClaimWrite
from batchsched.kube.binder import Binder
from batchsched.kube.fake import FakeKube


class SlowKube(FakeKube):
    """Each request answered after 1 ms, as a remote apiserver would, not at once."""

    async def _call(self, method: str, path: str, body: Any = None, kind: str = "") -> None:
        await asyncio.sleep(0.001)
        await super()._call(method, path, body, kind)


def bindings(n: int, extended: bool) -> list[Binding]:
    out = []
    alloc = {"devices": {"results": [{"request": "r", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"}]}}
    for i in range(n):
        me = {"resource": "pods", "name": f"p{i}", "uid": f"u{i}"}
        if extended:
            w = ClaimWrite(namespace="ns", name="", uid="", resource_version="", allocation=alloc, reserved_for=(me,),
                           create={"metadata": {"generateName": f"p{i}-extended-resources-"}, "spec": {}},
                           mappings=({"containerName": "main", "resourceName": "nvidia.com/gpu", "requestName": "r"},))
        else:
            w = ClaimWrite(namespace="ns", name=f"p{i}-gpu", uid=f"c{i}", resource_version="1", allocation=alloc,
                           reserved_for=(me,))
        out.append(Binding(uid=f"u{i}", namespace="ns", name=f"p{i}", node="n1", unit=f"ns/p{i}", claims=(w,)))
    return out


async def first_binding(n: int, extended: bool) -> None:
    kube = SlowKube()
    done: list[str] = []
    binder = Binder(kube, on_result=lambda b, o, e: done.append(o))
    binder.submit_all(bindings(n, extended))
    assert await binder.drain(600)
    first = next(i for i, c in enumerate(kube.calls) if c.path.endswith("/binding"))
    print(f"{'extended' if extended else 'template'}: {n} pods, {len(kube.calls)} requests, "
          f"first Binding is request {first + 1}; outcomes {sorted(set(done))}")


if __name__ == "__main__":
    for ext in (False, True):
        asyncio.run(first_binding(int(sys.argv[1]) if len(sys.argv) > 1 else 1000, ext))
