"""Lists and watch events are parsed without ``metadata.managedFields``, cut from the bytes:
the cut parses to the objects with that field dropped, and to nothing else."""

from __future__ import annotations

import copy
from typing import Any

import orjson
from hypothesis import example, given, settings
from hypothesis import strategies as st

from batchsched.kube.client import without_managed_fields

# what strings may hold: the characters the cut looks for among others
TEXT = st.lists(st.sampled_from([*list('ab"\\]}{[,:é'), '"metadata":{', ',"managedFields":[', ']},"', "spec"]),
                max_size=8).map("".join)
KEYS = st.sampled_from(["f:metadata", "f:spec", 'k:{"name":"x]},\\""}', "v:\"]}\"", "f:labels", ".", "i:0"])
FIELDS = st.recursive(st.just({}), lambda inner: st.dictionaries(KEYS | TEXT, inner, max_size=3), max_leaves=8)
ENTRY = st.fixed_dictionaries({"manager": TEXT, "operation": st.sampled_from(["Update", "Apply"]),
                               "apiVersion": st.just("v1"), "time": TEXT, "fieldsType": st.just("FieldsV1"),
                               "fieldsV1": FIELDS}, optional={"subresource": TEXT})
JSONV = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | TEXT,
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                     max_leaves=6)


@st.composite
def objects(draw: st.DrawFn) -> dict[str, Any]:
    """An object as the apiserver writes it: ``metadata`` first, ``managedFields`` last in
    it (when it has them), then maybe other keys (``spec``, ``data``...) or none."""
    meta: dict[str, Any] = {"name": draw(TEXT)}
    meta.update(draw(st.dictionaries(st.sampled_from(["labels", "annotations", "uid"]), JSONV, max_size=2)))
    if draw(st.booleans()):
        meta["managedFields"] = draw(st.lists(ENTRY, max_size=3))
    obj: dict[str, Any] = {"metadata": meta}
    obj.update(draw(st.dictionaries(st.sampled_from(["spec", "status", "data", "value"]), JSONV, max_size=3)))
    return obj


def _dropped(obj: Any) -> Any:
    out = copy.deepcopy(obj)
    for item in out.get("items", [out]):
        item["metadata"].pop("managedFields", None)
    return out


@settings(max_examples=1000, deadline=None)
@given(st.lists(objects(), max_size=5), st.booleans())
# a string that holds the bytes that end the field, up to its closing quote
@example([{"metadata": {"name": "", "managedFields": [{"manager": "", "operation": "Update", "apiVersion": "v1",
                                                      "time": "]},", "fieldsType": "FieldsV1", "fieldsV1": {}}]},
           "spec": {}}], False)
@example([{"metadata": {"name": "", "managedFields": [{"manager": "]},", "operation": "Update", "apiVersion": "v1",
                                                      "time": "", "fieldsType": "FieldsV1", "fieldsV1": {}}]}}], True)
def test_a_list_cut_parses_to_its_objects_without_their_managed_fields(items: list[dict[str, Any]], event: bool) -> None:
    if event:  # a watch event's object, alone, with kind and apiVersion before its metadata
        for obj in items:
            whole = {"kind": "Pod", "apiVersion": "v1", **obj}
            _same_but_kept(orjson.loads(without_managed_fields(orjson.dumps(whole))), whole)
        return
    page = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "7", "continue": ""}, "items": items}
    got = orjson.loads(without_managed_fields(orjson.dumps(page)))
    assert [k for k in got if k != "items"] == [k for k in page if k != "items"]
    assert len(got["items"]) == len(items)
    for g, obj in zip(got["items"], items, strict=True):
        _same_but_kept(g, obj)


def _same_but_kept(got: dict[str, Any], obj: dict[str, Any]) -> None:
    """``got`` is ``obj`` without its managedFields; or, only where no key follows its
    metadata, ``obj`` whole."""
    last = list(obj)[-1] == "metadata"
    assert got == _dropped(obj) or (last and got == obj)


def test_a_pod_as_the_apiserver_writes_it_loses_its_managed_fields_only() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "default", "uid": "u", "labels": {"a": "b"},
                     "managedFields": [{"manager": "kubectl", "operation": "Update", "apiVersion": "v1",
                                        "time": "2026-11-27T00:00:00Z", "fieldsType": "FieldsV1",
                                        "fieldsV1": {"f:spec": {'k:{"name":"main"}': {".": {}}}}}]},
        "spec": {"containers": [{"name": "main"}]},
        "status": {"phase": "Pending"},
    }
    raw = orjson.dumps({"items": [pod, pod]})
    cut = without_managed_fields(raw)
    assert len(cut) < len(raw) - 2 * 150
    assert orjson.loads(cut) == {"items": [_dropped(pod), _dropped(pod)]}
    assert without_managed_fields(b'{"items":[]}') == b'{"items":[]}'
