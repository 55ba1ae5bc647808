"""Node filters, soft scores and failure messages: each rule as a table, then the
vectorised NodeFilter held equal to the per-node rules on random clusters."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchsched.core.model import GPU, LabelSelector, Node, Pod, PodAffinityTerm, Taint, Toleration
from batchsched.core.placement.nodefilter import NodeFilter
from batchsched.core.placement.predicates import (
    REASON_AFFINITY,
    REASON_DELETING,
    REASON_NOT_READY,
    REASON_UNSCHEDULABLE,
    explain,
    matches_affinity,
    matches_term,
    reject_reason,
    tolerates,
    untolerated_taint,
)
from tests.builders import Expr, NodeBuilder, PodBuilder, make_node, make_pod

# -- tolerations --------------------------------------------------------------------------

T = Toleration
BROKEN = Taint("gpu", "broken", "NoSchedule")


@pytest.mark.parametrize(
    ("toleration", "taint", "expected"),
    [
        pytest.param(T(operator="Exists"), BROKEN, True, id="empty-key-exists-tolerates-all"),
        pytest.param(
            T(operator="Exists"),
            Taint("x", "", "NoExecute"),
            True,
            id="empty-key-exists-any-effect",
        ),
        pytest.param(
            T(operator="Exists", effect="NoExecute"),
            BROKEN,
            False,
            id="empty-key-exists-other-effect",
        ),
        pytest.param(
            T(operator="Equal", value="broken"),
            BROKEN,
            False,
            id="empty-key-equal-tolerates-nothing",
        ),
        pytest.param(T(key="gpu", operator="Exists"), BROKEN, True, id="key-exists-any-value"),
        pytest.param(T(key="cpu", operator="Exists"), BROKEN, False, id="key-exists-other-key"),
        pytest.param(
            T(key="gpu", operator="Equal", value="broken"), BROKEN, True, id="equal-same-value"
        ),
        pytest.param(
            T(key="gpu", operator="Equal", value="ok"), BROKEN, False, id="equal-other-value"
        ),
        pytest.param(
            T(key="gpu", operator="", value="broken"), BROKEN, True, id="empty-operator-is-equal"
        ),
        pytest.param(
            T(key="gpu", operator="Equal"),
            Taint("gpu", "", "NoSchedule"),
            True,
            id="equal-both-empty",
        ),
        pytest.param(T(key="gpu", operator="Equal"), BROKEN, False, id="equal-empty-vs-value"),
        pytest.param(
            T(key="gpu", operator="Exists", effect="NoSchedule"), BROKEN, True, id="effect-equal"
        ),
        pytest.param(
            T(key="gpu", operator="Exists", effect="NoExecute"), BROKEN, False, id="effect-differs"
        ),
        pytest.param(
            T(key="gpu", operator="Exists", effect=""),
            Taint("gpu", "", "NoExecute"),
            True,
            id="empty-effect-any",
        ),
        pytest.param(
            T(key="gpu", operator="Gt", value="1"), Taint("gpu", "2"), False, id="unknown-operator"
        ),
    ],
)
def test_tolerates(toleration: Toleration, taint: Taint, expected: bool) -> None:
    assert tolerates(toleration, taint) is expected


def test_untolerated_taint_is_the_first_hard_one() -> None:
    taints = (
        Taint("soft", "", "PreferNoSchedule"),
        Taint("a", "1", "NoSchedule"),
        Taint("b", "", "NoExecute"),
    )
    assert untolerated_taint(taints, ()) == Taint("a", "1", "NoSchedule")
    assert untolerated_taint(taints, (T(key="a", operator="Exists"),)) == Taint(
        "b", "", "NoExecute"
    )
    assert (
        untolerated_taint(taints, (T(key="a", operator="Exists"), T(key="b", operator="Exists")))
        is None
    )
    assert untolerated_taint((Taint("soft", "", "PreferNoSchedule"),), ()) is None


BROKEN_NODE = make_node("n").taint("gpu", "broken", "NoSchedule")


@pytest.mark.parametrize(
    ("node", "pod", "expected"),
    [
        pytest.param(BROKEN_NODE, make_pod("p"), "untolerated taint gpu=broken", id="none"),
        pytest.param(BROKEN_NODE, make_pod("p").tolerate(), None, id="tolerate-everything"),
        pytest.param(BROKEN_NODE, make_pod("p").tolerate("gpu"), None, id="key-exists"),
        pytest.param(
            BROKEN_NODE,
            make_pod("p").tolerate("gpu", "broken", effect="NoSchedule"),
            None,
            id="exact",
        ),
        pytest.param(
            BROKEN_NODE,
            make_pod("p").tolerate("gpu", "fine"),
            "untolerated taint gpu=broken",
            id="other-value",
        ),
        pytest.param(
            BROKEN_NODE,
            make_pod("p").tolerate("gpu", effect="NoExecute"),
            "untolerated taint gpu=broken",
            id="other-effect",
        ),
        pytest.param(
            BROKEN_NODE.copy().taint("nic", "", "NoExecute"),
            make_pod("p").tolerate("gpu", "broken"),
            "untolerated taint nic",
            id="second-taint-no-value",
        ),
        pytest.param(
            make_node("n").taint("gpu", "busy", "PreferNoSchedule"),
            make_pod("p"),
            None,
            id="prefer-never-rejects",
        ),
    ],
)
def test_taints_through_filters(node: NodeBuilder, pod: PodBuilder, expected: str | None) -> None:
    check(pod.build(), [node.build()], [expected])


# -- helpers ------------------------------------------------------------------------------


def check(pod: Pod, nodes: Sequence[Node], expected: Sequence[str | None]) -> None:
    """The per-node reasons are ``expected``, and the NodeFilter mask agrees with them."""
    assert [reject_reason(pod, n) for n in nodes] == list(expected)
    mask = NodeFilter(nodes).mask(pod)
    assert mask.tolist() == [e is None for e in expected]


LABELS = {"zone": "a", "gpus": "8", "tier": "x"}


def labelled(name: str = "n1") -> NodeBuilder:
    return make_node(name).label(LABELS)


# -- node affinity --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exprs", "fields", "expected"),
    [
        (["zone In a b"], [], True),
        (["zone In b"], [], False),
        (["missing In a"], [], False),
        (["zone In"], [], False),  # In without values is invalid: no match
        (["zone NotIn b"], [], True),
        (["zone NotIn a"], [], False),
        (["missing NotIn a"], [], True),
        (["zone NotIn"], [], False),
        (["zone Exists"], [], True),
        (["missing Exists"], [], False),
        (["zone Exists a"], [], False),  # Exists with values is invalid
        (["zone DoesNotExist"], [], False),
        (["missing DoesNotExist"], [], True),
        (["gpus Gt 4"], [], True),
        (["gpus Gt 8"], [], False),
        (["gpus Gt -1"], [], True),
        (["gpus Gt x"], [], False),  # unparsable requirement value
        (["tier Gt 1"], [], False),  # unparsable label value
        (["missing Gt 1"], [], False),
        (["gpus Gt 1 2"], [], False),  # Gt needs exactly one value
        (["gpus Gt 99999999999999999999"], [], False),  # beyond int64
        (["gpus Lt 16"], [], True),
        (["gpus Lt 8"], [], False),
        (["tier Lt 1"], [], False),
        (["missing Lt 100"], [], False),
        (["zone Near a"], [], False),  # unknown operator
        (["zone In a", "gpus Gt 4"], [], True),  # expressions ANDed
        (["zone In a", "gpus Gt 10"], [], False),
        ([], ["metadata.name In n1"], True),
        ([], ["metadata.name In n2"], False),
        ([], ["metadata.name NotIn n2"], True),
        ([], ["metadata.name NotIn n1"], False),
        ([], ["metadata.name In n1 n2"], False),  # one value only
        ([], ["metadata.name Exists"], False),
        ([], ["metadata.uid In n1"], False),  # only metadata.name
        (["zone In a"], ["metadata.name In n1"], True),  # fields ANDed with expressions
        (["zone In b"], ["metadata.name In n1"], False),
        (["zone In a"], ["metadata.name In n2"], False),
    ],
)
def test_required_affinity_operators(exprs: list[str], fields: list[str], expected: bool) -> None:
    pod = (
        make_pod("p")
        .require(*map(parse_expr, exprs), fields=[parse_expr(f) for f in fields])
        .build()
    )
    node = labelled("n1").build()
    assert pod.required_terms is not None
    assert matches_term(node, pod.required_terms[0]) is expected
    # n2 carries the same labels, so it differs from n1 only by name.
    other = labelled("n2").build()
    nodes = [node, other, make_node("bare").build()]
    expected_reasons = [reject_reason(pod, n) for n in nodes]
    assert (expected_reasons[0] is None) is expected
    assert NodeFilter(nodes).mask(pod).tolist() == [r is None for r in expected_reasons]


def parse_expr(text: str) -> Expr:
    return tuple(text.split())


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param(make_pod("p"), [True, True, True], id="nothing-required"),
        pytest.param(
            make_pod("p").require_nothing(), [False, False, False], id="no-terms-match-nothing"
        ),
        pytest.param(
            make_pod("p").require(), [False, False, False], id="empty-term-matches-nothing"
        ),
        pytest.param(
            make_pod("p").require().require(("zone", "In", "a")),
            [True, False, False],
            id="empty-or-term",
        ),
        pytest.param(
            make_pod("p").require(("zone", "In", "a")).require(("zone", "In", "b")),
            [True, True, False],
            id="terms-ored",
        ),
        pytest.param(
            make_pod("p").selector(pool="x").require(("zone", "In", "a", "b")),
            [False, True, False],
            id="selector-and-affinity",
        ),
    ],
)
def test_required_terms(pod: PodBuilder, expected: list[bool]) -> None:
    nodes = [
        make_node("a").label(zone="a").build(),
        make_node("b").label(zone="b", pool="x").build(),
        make_node("c").label(zone="c", pool="x").build(),
    ]
    built = pod.build()
    assert [matches_affinity(n, built) for n in nodes] == expected
    check(built, nodes, [None if ok else REASON_AFFINITY for ok in expected])


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ({}, [True, True, True]),
        ({"pool": "a"}, [True, False, False]),
        ({"pool": "b"}, [False, True, False]),
        ({"pool": "a", "zone": "1"}, [True, False, False]),
        ({"pool": "a", "zone": "2"}, [False, False, False]),
        ({"missing": "a"}, [False, False, False]),
        ({"pool": ""}, [False, False, False]),
        ({"topology.kubernetes.io/zone": "z"}, [False, False, True]),
    ],
)
def test_node_selector(selector: dict[str, str], expected: list[bool]) -> None:
    nodes = [
        make_node("a").label(pool="a", zone="1").build(),
        make_node("b").label(pool="b", zone="1").build(),
        make_node("c").label({"topology.kubernetes.io/zone": "z"}).build(),
    ]
    pod = make_pod("p").selector(selector).build()
    check(pod, nodes, [None if ok else REASON_AFFINITY for ok in expected])


# -- node conditions ----------------------------------------------------------------------

UNSCHEDULABLE_KEY = "node.kubernetes.io/unschedulable"
NOT_READY_KEY = "node.kubernetes.io/not-ready"


@pytest.mark.parametrize(
    ("node", "pod", "expected"),
    [
        pytest.param(
            make_node("n").unschedulable(), make_pod("p"), REASON_UNSCHEDULABLE, id="cordoned"
        ),
        pytest.param(
            make_node("n").unschedulable(),
            make_pod("p").tolerate(UNSCHEDULABLE_KEY, effect="NoSchedule"),
            None,
            id="cordoned-tolerated",
        ),
        pytest.param(
            make_node("n").unschedulable(),
            make_pod("p").tolerate(),
            None,
            id="cordoned-tolerate-all",
        ),
        pytest.param(
            make_node("n").unschedulable(),
            make_pod("p").tolerate(UNSCHEDULABLE_KEY, effect="NoExecute"),
            REASON_UNSCHEDULABLE,
            id="cordoned-wrong-effect",
        ),
        pytest.param(make_node("n").unschedulable(False), make_pod("p"), None, id="uncordoned"),
        pytest.param(make_node("n").not_ready(), make_pod("p"), REASON_NOT_READY, id="not-ready"),
        pytest.param(
            make_node("n").not_ready(),
            make_pod("p").tolerate(NOT_READY_KEY, effect="NoSchedule"),
            None,
            id="not-ready-tolerated",
        ),
        pytest.param(
            make_node("n").not_ready(),
            make_pod("p").tolerate(NOT_READY_KEY),
            None,
            id="not-ready-any-effect",
        ),
        pytest.param(
            make_node("n").not_ready(),
            make_pod("p").tolerate(NOT_READY_KEY, effect="NoExecute"),
            REASON_NOT_READY,
            id="not-ready-noexecute-only",
        ),
        pytest.param(make_node("n").deleting(), make_pod("p"), REASON_DELETING, id="deleting"),
        pytest.param(
            make_node("n").deleting(),
            make_pod("p").tolerate(),
            REASON_DELETING,
            id="deleting-tolerate-all",
        ),
    ],
)
def test_node_conditions(node: NodeBuilder, pod: PodBuilder, expected: str | None) -> None:
    check(pod.build(), [node.build()], [expected])


def test_reasons_come_in_order() -> None:
    picky = make_pod("p").selector(pool="a").build()
    tolerant = make_pod("p").selector(pool="a").tolerate("gpu").build()
    cases = [
        (
            make_node("n").deleting().unschedulable().not_ready().taint("gpu", "broken"),
            picky,
            REASON_DELETING,
        ),
        (
            make_node("n").unschedulable().not_ready().taint("gpu", "broken"),
            picky,
            REASON_UNSCHEDULABLE,
        ),
        (make_node("n").not_ready().taint("gpu", "broken"), picky, REASON_NOT_READY),
        (make_node("n").taint("gpu", "broken"), picky, "untolerated taint gpu=broken"),
        (make_node("n").taint("gpu", "broken"), tolerant, REASON_AFFINITY),
        (make_node("n").taint("gpu", "broken").label(pool="a"), tolerant, None),
    ]
    for node, pod, expected in cases:
        check(pod, [node.build()], [expected])


def with_namespace_selector(pod: Pod) -> Pod:
    """``pod`` with a required anti-affinity term that selects namespaces by label."""
    term = PodAffinityTerm(LabelSelector({"app": "x"}), "kubernetes.io/hostname",
                           namespace_selector=LabelSelector({"team": "a"}))
    return replace(pod, anti_affinity_terms=(*pod.anti_affinity_terms, term))


def test_pod_affinity_is_left_to_podtopology_but_a_namespace_selector_fits_nowhere() -> None:
    nodes = [make_node("a").build(), make_node("b").build()]
    plain = make_pod("p").pod_anti_affinity(app="x").build()
    assert NodeFilter(nodes).mask(plain).tolist() == [True, True]
    assert all(reject_reason(plain, n) is None for n in nodes)
    pod = with_namespace_selector(make_pod("p").build())
    assert not NodeFilter(nodes).mask(pod).any()
    assert all(reject_reason(pod, n) is not None for n in nodes)
    assert NodeFilter(nodes).static_score(pod).tolist() == [0, 0]


# -- soft scores ----------------------------------------------------------------------------


def prefer_taints(name: str, count: int) -> NodeBuilder:
    node = make_node(name)
    for i in range(count):
        node.taint(f"soft{i}", "", "PreferNoSchedule")
    return node


@pytest.mark.parametrize(
    ("counts", "pod", "expected"),
    [
        pytest.param([0, 1, 2], make_pod("p"), [300, 150, 0], id="linear"),
        pytest.param([0, 1, 3], make_pod("p"), [300, 201, 0], id="integer-division"),
        pytest.param([0, 0], make_pod("p"), [300, 300], id="no-taints-all-max"),
        pytest.param([1, 1], make_pod("p"), [0, 0], id="all-equal"),
        pytest.param(
            [0, 1, 2],
            make_pod("p").tolerate("soft0"),
            [300, 300, 0],
            id="tolerated-by-empty-effect",
        ),
        pytest.param(
            [0, 1, 2],
            make_pod("p").tolerate("soft0", effect="PreferNoSchedule"),
            [300, 300, 0],
            id="tolerated-prefer",
        ),
        pytest.param(
            [0, 1, 2],
            make_pod("p").tolerate("soft0", effect="NoSchedule"),
            [300, 150, 0],
            id="noschedule-does-not-count",
        ),
        pytest.param(
            [0, 1, 2],
            make_pod("p").tolerate(effect="PreferNoSchedule"),
            [300, 300, 300],
            id="tolerate-every-prefer",
        ),
    ],
)
def test_prefer_no_schedule_score(counts: list[int], pod: PodBuilder, expected: list[int]) -> None:
    nodes = [prefer_taints(f"n{i}", c).build() for i, c in enumerate(counts)]
    # An infeasible node with more PreferNoSchedule taints must not move the maximum.
    nodes.append(prefer_taints("hard", 5).taint("x", "", "NoSchedule").build())
    score = NodeFilter(nodes).static_score(pod.build())
    assert score.dtype == np.int64
    assert score.tolist() == [*expected, 0]


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        # zone=a weight 30, gpu weight 10: sums 40, 30, 10, 0 -> 100, 75, 25, 0
        pytest.param(
            make_pod("p").prefer(30, ("zone", "In", "a")).prefer(10, ("gpu", "Exists")),
            [100, 75, 25, 0],
            id="sum",
        ),
        pytest.param(make_pod("p").prefer(7, ("zone", "In", "a")), [100, 100, 0, 0], id="one-term"),
        pytest.param(
            make_pod("p").prefer(3, ("zone", "In", "z")), [0, 0, 0, 0], id="nothing-matches"
        ),
        pytest.param(make_pod("p"), [0, 0, 0, 0], id="no-preferences"),
        pytest.param(
            make_pod("p").prefer(0, ("zone", "In", "a")), [0, 0, 0, 0], id="zero-weight-skipped"
        ),
        pytest.param(make_pod("p").prefer(50), [0, 0, 0, 0], id="empty-term-skipped"),
        pytest.param(
            make_pod("p")
            .prefer(3, ("zone", "In", "a"))
            .prefer(5, fields=[("metadata.name", "In", "c")]),
            [60, 60, 100, 0],
            id="match-fields",
        ),
        # The infeasible node matches a heavier term; normalising ignores it.
        pytest.param(
            make_pod("p").prefer(10, ("zone", "In", "a")).prefer(90, ("pool", "In", "off")),
            [100, 100, 0, 0],
            id="max-over-feasible",
        ),
    ],
)
def test_preferred_affinity_score(pod: PodBuilder, expected: list[int]) -> None:
    nodes = [
        make_node("a").label(zone="a", gpu="yes").build(),
        make_node("b").label(zone="a").build(),
        make_node("c").label(gpu="yes").build(),
        make_node("d").build(),
        make_node("off").label(zone="a", gpu="yes", pool="off").taint("t", "", "NoExecute").build(),
    ]
    score = NodeFilter(nodes).static_score(pod.build())
    assert score.tolist() == [300 + 2 * e for e in expected] + [0]


def test_scores_combine_taints_and_affinity() -> None:
    nodes = [
        make_node("a").label(zone="a").taint("s", "", "PreferNoSchedule").build(),
        make_node("b").build(),
    ]
    pod = make_pod("p").prefer(10, ("zone", "In", "a")).build()
    assert NodeFilter(nodes).static_score(pod).tolist() == [3 * 0 + 2 * 100, 3 * 100 + 2 * 0]


# -- messages -----------------------------------------------------------------------------


def test_explain_counts_reasons_and_insufficient() -> None:
    nodes = [make_node(f"g{i}").build() for i in range(32)]
    nodes += [make_node(f"b{i}").taint("gpu", "broken").build() for i in range(8)]
    pod = make_pod("p").req(gpu=1).build()
    fil = NodeFilter(nodes)
    mask = fil.mask(pod)
    expected = "0/40 nodes fit: 32 insufficient nvidia.com/gpu, 8 untolerated taint gpu=broken."
    assert explain(pod, nodes, {GPU: 32}) == expected
    assert explain(pod, nodes, {GPU: 32}, mask=mask) == expected
    assert fil.explain(pod, {GPU: 32}) == expected


def test_explain_sorts_by_count_then_text() -> None:
    nodes = [
        make_node("a").unschedulable().build(),
        make_node("b").not_ready().build(),
        make_node("c").deleting().build(),
        make_node("d").deleting().build(),
        make_node("e").taint("k").build(),
        make_node("f").label(pool="b").build(),
        make_node("g").build(),
    ]
    pod = make_pod("p").selector(pool="a").build()
    expected = (
        "0/7 nodes fit: 2 node(s) being deleted, 2 node(s) didn't match Pod's node affinity/selector, "
        "1 insufficient cpu, 1 node(s) were not ready, 1 node(s) were unschedulable, 1 untolerated taint k."
    )
    insufficient = {"cpu": 1, "memory": 0}
    assert explain(pod, nodes, insufficient) == expected
    assert NodeFilter(nodes).explain(pod, insufficient) == expected


def test_explain_special_cases() -> None:
    nodes = [make_node("a").build(), make_node("b").build()]
    assert explain(make_pod("p").build(), []) == "0/0 nodes fit: the cluster has no nodes."
    assert (
        NodeFilter([]).explain(make_pod("p").build()) == "0/0 nodes fit: the cluster has no nodes."
    )
    anti = with_namespace_selector(make_pod("p").build())
    expected = (
        "0/2 nodes fit: batchsched does not support a namespaceSelector in required pod "
        "anti-affinity terms yet (list the namespaces instead)."
    )
    assert explain(anti, nodes) == expected
    assert NodeFilter(nodes).explain(anti) == expected
    # Every node passed the filters and nothing was reported insufficient.
    assert explain(make_pod("p").build(), nodes) == "0/2 nodes fit."


def test_explain_rejects_a_mask_of_the_wrong_length() -> None:
    with pytest.raises(ValueError, match="shape"):
        explain(make_pod("p").build(), [make_node("a").build()], mask=np.ones(2, dtype=bool))


# -- caching ------------------------------------------------------------------------------


def test_results_are_cached_by_constraints() -> None:
    nodes = [
        make_node("a").label(pool="a").build(),
        make_node("b").label(pool="b").taint("s", "", "PreferNoSchedule").build(),
    ]
    fil = NodeFilter(nodes)
    first = make_pod("p0").selector(pool="a").req(gpu=1).build()
    second = make_pod("p1").selector(pool="a").req(cpu="3").build()
    assert first.constraint_key() == second.constraint_key()
    mask, score = fil.mask(first), fil.static_score(first)
    assert fil.mask(second) is mask
    assert fil.static_score(second) is score
    assert mask.tolist() == [True, False]
    assert score.tolist() == [300, 0]
    with pytest.raises(ValueError):
        mask[1] = True  # cached arrays are read-only
    other = make_pod("p2").selector(pool="b").build()
    assert fil.mask(other).tolist() == [False, True]
    assert fil.mask(first).tolist() == [True, False]
    # The same constraints plus refused pod affinity must not reuse the cached mask.
    anti = with_namespace_selector(make_pod("p3").selector(pool="a").build())
    assert anti.constraint_key() != first.constraint_key()
    assert fil.mask(anti).tolist() == [False, False]
    assert fil.mask(first).tolist() == [True, False]


def test_large_cluster_one_selector_key() -> None:
    nodes = [make_node(f"n{i}").label(pool=f"p{i % 10}").build() for i in range(5000)]
    fil = NodeFilter(nodes)
    pod = make_pod("p").selector(pool="p3").build()
    mask = fil.mask(pod)
    assert mask.shape == (5000,)
    assert np.flatnonzero(mask).tolist() == list(range(3, 5000, 10))


# -- builders -----------------------------------------------------------------------------


def test_builders_round_trip() -> None:
    pod = (
        make_pod("p", "ns")
        .req(cpu="2", gpu=1, memory="1Gi")
        .selector(pool="a")
        .tolerate("gpu", "broken", effect="NoSchedule")
        .prefer(5, ("zone", "In", "a"))
        .priority(7)
        .build()
    )
    assert pod.key == "ns/p"
    assert pod.requests == {"cpu": 2000, GPU: 1, "memory": 2**30, "pods": 1,
                            "batchsched.io/gpu": 1000, "batchsched.io/ask-any-cards": 1,
                            "batchsched.io/card-any": 1}
    assert pod.node_selector == {"pool": "a"}
    assert pod.tolerations == (Toleration("gpu", "Equal", "broken", "NoSchedule"),)
    assert pod.required_terms is None
    assert pod.priority == 7
    assert pod.scheduler_name == "batchsched"
    node = (
        make_node("n1")
        .cap(cpu="8", memory="32Gi", gpu=8)
        .label(pool="a")
        .taint("gpu", "broken", "NoSchedule")
        .unschedulable()
        .not_ready()
        .build()
    )
    assert node.allocatable == {"cpu": 8000, "memory": 32 * 2**30, GPU: 8, "pods": 110}
    assert node.labels == {"pool": "a"}
    assert node.taints == (Taint("gpu", "broken", "NoSchedule"),)
    assert node.unschedulable and not node.ready and not node.deleting
    assert make_node("n").obj()["metadata"]["name"] == "n"
    assert make_pod("p").obj()["spec"]["containers"][0]["name"] == "main"


# -- the vectorised filter equals the per-node rules ---------------------------------------

KEYS = ["a", "b", "c"]
VALUES = ["1", "2", "10", "x"]
OPERATORS = ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
NAMES = [f"n{i}" for i in range(6)]
EFFECTS = ["NoSchedule", "NoExecute", "PreferNoSchedule"]

taints = st.builds(
    Taint,
    key=st.sampled_from(["t", "u"]),
    value=st.sampled_from(["", "v"]),
    effect=st.sampled_from(EFFECTS),
)


@st.composite
def nodes_strategy(draw: st.DrawFn) -> list[Node]:
    count = draw(st.integers(0, 6))
    out: list[Node] = []
    for i in range(count):
        node = make_node(NAMES[i]).label(
            draw(st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=3))
        )
        for taint in draw(st.lists(taints, max_size=2)):
            node.taint(taint.key, taint.value, taint.effect)
        if draw(st.booleans()):
            node.unschedulable(draw(st.booleans()))
        if draw(st.integers(0, 4)) == 0:
            node.not_ready()
        if draw(st.integers(0, 6)) == 0:
            node.deleting()
        out.append(node.build())
    return out


@st.composite
def expr_strategy(draw: st.DrawFn) -> Expr:
    op = draw(st.sampled_from(OPERATORS))
    if op in ("Exists", "DoesNotExist"):
        values = [] if draw(st.integers(0, 5)) else ["1"]
    elif op in ("Gt", "Lt"):
        values = draw(
            st.lists(
                st.sampled_from([*VALUES, "-3"]),
                min_size=1,
                max_size=2 if draw(st.integers(0, 5)) == 0 else 1,
            )
        )
    else:
        values = draw(st.lists(st.sampled_from(VALUES), max_size=3, unique=True))
    return (draw(st.sampled_from(KEYS)), op, *values)


@st.composite
def field_strategy(draw: st.DrawFn) -> Expr:
    key = "metadata.name" if draw(st.integers(0, 5)) else "metadata.uid"
    op = draw(st.sampled_from(["In", "NotIn", "In", "NotIn", "Exists"]))
    values = draw(
        st.lists(
            st.sampled_from(NAMES), min_size=1, max_size=2 if draw(st.integers(0, 5)) == 0 else 1
        )
    )
    return (key, op, *values)


@st.composite
def pods_strategy(draw: st.DrawFn) -> Pod:
    pod = make_pod("p").selector(
        draw(st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=2))
    )
    required = draw(st.sampled_from(["none", "none", "empty", "terms"]))
    if required == "empty":
        pod.require_nothing()
    elif required == "terms":
        for _ in range(draw(st.integers(1, 3))):
            pod.require(
                *draw(st.lists(expr_strategy(), max_size=3)),
                fields=draw(st.lists(field_strategy(), max_size=1)),
            )
    for _ in range(draw(st.integers(0, 3))):
        pod.prefer(
            draw(st.integers(0, 100)),
            *draw(st.lists(expr_strategy(), max_size=2)),
            fields=draw(st.lists(field_strategy(), max_size=1)),
        )
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(["", "t", "u", UNSCHEDULABLE_KEY, NOT_READY_KEY]))
        operator = draw(st.sampled_from(["Exists", "Equal"]))
        value = draw(st.sampled_from(["", "v"])) if operator == "Equal" else None
        pod.tolerate(key, value, effect=draw(st.sampled_from(["", *EFFECTS])), operator=operator)
    if draw(st.integers(0, 9)) == 0:
        pod.pod_affinity(app="x")
    return pod.build()


def reference_score(pod: Pod, nodes: Sequence[Node]) -> list[int]:
    """static_score written the slow, obvious way."""
    feasible = [reject_reason(pod, n) is None for n in nodes]
    soft = [t for t in pod.tolerations if t.effect in ("", "PreferNoSchedule")]
    counts = [
        sum(
            1
            for taint in n.taints
            if taint.effect == "PreferNoSchedule" and not any(tolerates(t, taint) for t in soft)
        )
        for n in nodes
    ]
    sums = [
        sum(w for w, term in pod.preferred_terms if w > 0 and matches_term(n, term)) for n in nodes
    ]
    max_count = max((c for c, ok in zip(counts, feasible, strict=True) if ok), default=0)
    max_sum = max((s for s, ok in zip(sums, feasible, strict=True) if ok), default=0)
    out = []
    for ok, c, s in zip(feasible, counts, sums, strict=True):
        taint_score = 100 if max_count == 0 else 100 - c * 100 // max_count
        affinity_score = 0 if max_sum == 0 else s * 100 // max_sum
        out.append(3 * taint_score + 2 * affinity_score if ok else 0)
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=nodes_strategy(), pods=st.lists(pods_strategy(), min_size=1, max_size=3))
def test_node_filter_matches_per_node_rules(nodes: list[Node], pods: list[Pod]) -> None:
    fil = NodeFilter(nodes)
    for pod in pods:
        reasons = [reject_reason(pod, n) for n in nodes]
        mask = fil.mask(pod)
        assert mask.dtype == np.bool_
        assert mask.tolist() == [r is None for r in reasons]
        assert fil.static_score(pod).tolist() == reference_score(pod, nodes)
        assert fil.reasons(pod) == Counter(r for r in reasons if r is not None)
        assert fil.explain(pod, {"cpu": 1}) == explain(pod, nodes, {"cpu": 1})
        assert explain(pod, nodes, mask=mask) == explain(pod, nodes)
        # A second look, served from the cache, gives the same answer.
        assert fil.mask(pod).tolist() == mask.tolist()
