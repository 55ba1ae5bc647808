"""The monitoring manifests (``manifests/overlays/with-monitoring/``) against the metrics batchsched
defines: a dashboard or an alert that names a metric or a label that does not exist shows
nothing, or never fires, and nobody notices until the day it was needed.

Every PromQL expression of the Grafana dashboard and of the PrometheusRule is parsed (a
small parser for the part of PromQL the manifests use: selectors, ranges, functions,
aggregations, binary operators with ``on``/``ignoring``/``group_*``), then held to what
:class:`batchsched.metrics.Metrics` registers: each series name exists (histograms only as
``_bucket``/``_sum``/``_count``, suffixes only on histograms), ``histogram_quantile`` reads
``_bucket`` series that keep ``le``, and every label in a matcher, a ``by (...)``, an
``on (...)`` or an annotation's ``$labels.x`` is one the series carries. Each checker is
also run on a wrong input, so a checker that stopped looking fails.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from batchsched.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "manifests" / "overlays" / "with-monitoring"
DASHBOARD = MONITORING / "grafana-dashboard.json"
ALERTS = MONITORING / "alerts.yaml"
ALERT_TESTS = MONITORING / "alerts.test.yaml"
SERVICE_MONITOR = MONITORING / "servicemonitor.yaml"
DEPLOYMENT = ROOT / "manifests" / "base" / "deployment.yaml"

#: labels Prometheus adds to every scraped series (the target's, from the ServiceMonitor)
TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "service", "endpoint", "container"})
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
SEVERITIES = ("critical", "warning", "info")
#: Grafana's interval variables, read as a duration
GRAFANA_INTERVALS = re.compile(r"\$__(rate_interval|interval|range)\b")


# -- what batchsched exports ---------------------------------------------------------------


@dataclass(frozen=True)
class Series:
    """One series name of the exposition: its metric's type and labels."""

    metric: str
    kind: str  # counter, gauge, histogram
    labels: frozenset[str]


def exported(metrics: Metrics | None = None) -> dict[str, Series]:
    """Every series name a :class:`Metrics` exposes, read from its registry's collectors."""
    metrics = metrics or Metrics()
    collectors = [c for c in vars(metrics).values() if isinstance(c, MetricWrapperBase)]
    families = {f.name: f.type for f in metrics.registry.collect()}
    # every collector of the registry is one of the object's metrics, and the other way round
    assert {c._name for c in collectors} == set(families)
    out: dict[str, Series] = {}
    for c in collectors:
        name, kind, labels = c._name, families[c._name], frozenset(c._labelnames)
        if kind == "counter":
            out[f"{name}_total"] = Series(name, kind, labels)
        elif kind == "histogram":
            for suffix in HISTOGRAM_SUFFIXES:
                out[name + suffix] = Series(name, kind, labels | {"le"} if suffix == "_bucket" else labels)
        else:
            out[name] = Series(name, kind, labels)
    return out


SERIES = exported()
HISTOGRAMS = {s.metric for s in SERIES.values() if s.kind == "histogram"}
METRIC_KINDS = {s.metric: s.kind for s in SERIES.values()}


def metric_names(expr: str) -> set[str]:
    """The batchsched metrics an expression names (histogram suffixes taken off)."""
    names = set()
    for token in re.findall(r"batchsched_[a-z_]+", expr):
        for suffix in HISTOGRAM_SUFFIXES:
            if token.endswith(suffix) and token[: -len(suffix)] in HISTOGRAMS:
                token = token[: -len(suffix)]
        names.add(token)
    return names


# -- a parser for the PromQL the manifests use ------------------------------------------------


class PromQLError(ValueError):
    pass


_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?(?![A-Za-z_]))
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>==|!=|>=|<=|=~|!~|[-+*/%^<>=])
  | (?P<punct>[(){},])
""", re.VERBOSE)
_DURATION = re.compile(r"(\d+(ms|[smhdwy]))+")
AGGREGATIONS = frozenset({"sum", "min", "max", "avg", "count", "stddev", "stdvar", "group",
                          "topk", "bottomk", "quantile", "count_values"})
#: functions, and which argument must be a range vector
FUNCTIONS = {
    "rate": 0, "irate": 0, "increase": 0, "delta": 0, "avg_over_time": 0, "max_over_time": 0,
    "min_over_time": 0, "sum_over_time": 0, "absent_over_time": 0,
    "histogram_quantile": None, "absent": None, "vector": None, "scalar": None, "abs": None,
    "clamp_min": None, "clamp_max": None, "time": None, "round": None,
}
COMPARISONS = frozenset({"==", "!=", ">", "<", ">=", "<="})
PRECEDENCE = {"or": 1, "and": 2, "unless": 2, **dict.fromkeys(COMPARISONS, 3), "+": 4, "-": 4,
              "*": 5, "/": 5, "%": 5, "atan2": 5, "^": 6}


@dataclass
class Selector:
    name: str
    matchers: list[tuple[str, str, str]]
    range: str | None = None


@dataclass
class Call:
    func: str
    args: list[Any]


@dataclass
class Aggregation:
    op: str
    grouping: str | None  # "by", "without" or None
    labels: list[str]
    args: list[Any]


@dataclass
class Binary:
    op: str
    lhs: Any
    rhs: Any
    matching: str | None  # "on", "ignoring" or None
    labels: list[str]


@dataclass
class Literal:
    value: str


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        text = GRAFANA_INTERVALS.sub("5m", text)
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                raise PromQLError(f"cannot read {text[pos:pos + 20]!r}")
            pos = m.end()
            if m.lastgroup != "space":
                self.tokens.append((m.lastgroup or "", m.group()))
        self.i = 0

    def peek(self) -> tuple[str, str]:
        return self.tokens[self.i] if self.i < len(self.tokens) else ("end", "")

    def take(self, value: str | None = None) -> tuple[str, str]:
        kind, text = self.peek()
        if kind == "end" or (value is not None and text != value):
            raise PromQLError(f"expected {value or 'more'}, found {text or 'the end'}")
        self.i += 1
        return kind, text

    def parse(self) -> Any:
        node = self.expr()
        if self.peek()[0] != "end":
            raise PromQLError(f"unexpected {self.peek()[1]!r}")
        return node

    def expr(self, floor: int = 1) -> Any:
        """Binary operators by precedence (``^`` binds to the right)."""
        node = self.unary()
        while PRECEDENCE.get(self.peek()[1], 0) >= floor:
            op = self.take()[1]
            if op in COMPARISONS and self.peek()[1] == "bool":
                self.take()
            matching: str | None = None
            labels: list[str] = []
            if self.peek()[1] in ("on", "ignoring"):
                matching = self.take()[1]
                labels = self.labels()
                if self.peek()[1] in ("group_left", "group_right"):
                    self.take()
                    if self.peek()[1] == "(":
                        labels = labels + self.labels()
            rhs = self.expr(PRECEDENCE[op] + (op != "^"))
            node = Binary(op, node, rhs, matching, labels)
        return node

    def unary(self) -> Any:
        if self.peek()[1] in ("-", "+"):
            self.take()
        return self.primary()

    def labels(self) -> list[str]:
        self.take("(")
        out: list[str] = []
        while self.peek()[1] != ")":
            kind, name = self.take()
            if kind != "ident":
                raise PromQLError(f"expected a label name, found {name!r}")
            out.append(name)
            if self.peek()[1] == ",":
                self.take()
        self.take(")")
        return out

    def args(self) -> list[Any]:
        self.take("(")
        out: list[Any] = []
        while self.peek()[1] != ")":
            out.append(self.expr())
            if self.peek()[1] == ",":
                self.take()
            elif self.peek()[1] != ")":
                raise PromQLError(f"expected , or ), found {self.peek()[1] or 'the end'}")
        self.take(")")
        return out

    def primary(self) -> Any:
        kind, text = self.peek()
        if kind in ("number", "string"):
            self.take()
            return Literal(text)
        if text == "(":
            self.take()
            node = self.expr()
            self.take(")")
            return self.range_of(node)
        if kind != "ident":
            raise PromQLError(f"unexpected {text or 'end'}")
        self.take()
        if text in AGGREGATIONS:
            grouping, labels = None, []
            if self.peek()[1] in ("by", "without"):
                grouping = self.take()[1]
                labels = self.labels()
            args = self.args()
            if grouping is None and self.peek()[1] in ("by", "without"):
                grouping = self.take()[1]
                labels = self.labels()
            return Aggregation(text, grouping, labels, args)
        if self.peek()[1] == "(":
            if text not in FUNCTIONS:
                raise PromQLError(f"unknown function {text}")
            return Call(text, self.args())
        matchers: list[tuple[str, str, str]] = []
        if self.peek()[1] == "{":
            self.take()
            while self.peek()[1] != "}":
                label = self.take()
                op = self.take()
                value = self.take()
                if label[0] != "ident" or op[1] not in ("=", "!=", "=~", "!~") or value[0] != "string":
                    raise PromQLError(f"bad matcher {label[1]}{op[1]}{value[1]}")
                matchers.append((label[1], op[1], value[1]))
                if self.peek()[1] == ",":
                    self.take()
            self.take("}")
        return self.range_of(Selector(text, matchers))

    def range_of(self, node: Any) -> Any:
        if self.peek()[0] == "range":
            text = self.take()[1][1:-1].strip()
            if not _DURATION.fullmatch(text) or not isinstance(node, Selector):
                raise PromQLError(f"bad range [{text}]")
            node.range = text
        return node


def parse(expr: str) -> Any:
    return _Parser(expr).parse()


# -- checks ----------------------------------------------------------------------------------


def labels_of(node: Any, problems: list[str]) -> frozenset[str] | None:
    """The labels of what ``node`` evaluates to (None for a scalar), appending to
    ``problems`` what does not hold."""
    if isinstance(node, Literal):
        return None
    if isinstance(node, Selector):
        series = SERIES.get(node.name)
        if series is None:
            base = next((node.name[: -len(s)] for s in HISTOGRAM_SUFFIXES if node.name.endswith(s)), "")
            if node.name in HISTOGRAMS:
                problems.append(f"{node.name} is a histogram: read its _bucket, _sum or _count")
            elif base in METRIC_KINDS:
                problems.append(f"{node.name}: {base} is a {METRIC_KINDS[base]}, not a histogram")
            else:
                problems.append(f"{node.name}: unknown metric")
            return frozenset()
        known = series.labels | TARGET_LABELS
        problems.extend(f"{node.name}{{{label}...}}: no label {label}"
                        for label, _, _ in node.matchers if label not in known)
        return known
    if isinstance(node, Call):
        arg_labels = [labels_of(a, problems) for a in node.args]
        want = FUNCTIONS[node.func]
        if want is not None and not (len(node.args) > want and isinstance(node.args[want], Selector)
                                     and node.args[want].range):
            problems.append(f"{node.func}() needs a range selector")
        if node.func == "histogram_quantile":
            if len(node.args) != 2:
                problems.append("histogram_quantile() takes a quantile and the buckets")
                return frozenset()
            names = [s.name for s in selectors(node.args[1])]
            problems.extend(f"histogram_quantile() over {n}, not a _bucket series"
                            for n in names if not n.endswith("_bucket"))
            buckets = arg_labels[1] or frozenset()
            if "le" not in buckets:
                problems.append("histogram_quantile() over buckets that lost their le label")
            return buckets - {"le"}
        if node.func in ("absent", "vector", "time", "scalar"):
            return frozenset() if node.func != "scalar" else None
        return arg_labels[0] if arg_labels else None
    if isinstance(node, Aggregation):
        inner = labels_of(node.args[-1], problems) or frozenset()
        problems.extend(f"{node.op} {node.grouping} ({label}): the series have no label {label}"
                        for label in node.labels if label not in inner)
        if node.grouping == "by":
            return frozenset(node.labels)
        if node.grouping == "without":
            return inner - set(node.labels)
        return frozenset()
    if isinstance(node, Binary):
        lhs, rhs = labels_of(node.lhs, problems), labels_of(node.rhs, problems)
        if node.matching is not None:
            both = (lhs or frozenset()) & (rhs or frozenset())
            problems.extend(f"{node.op} {node.matching} ({label}): not a label of both sides"
                            for label in node.labels if label not in both)
        return lhs if lhs is not None else rhs
    raise AssertionError(node)


def selectors(node: Any) -> list[Selector]:
    if isinstance(node, Selector):
        return [node]
    children = (node.args if isinstance(node, (Call, Aggregation))
                else [node.lhs, node.rhs] if isinstance(node, Binary) else [])
    return [s for child in children for s in selectors(child)]


def expr_problems(expr: str) -> list[str]:
    """What is wrong with a PromQL expression against batchsched's metrics ([] if nothing)."""
    try:
        tree = parse(expr)
    except PromQLError as exc:
        return [f"does not parse: {exc}"]
    problems: list[str] = []
    labels_of(tree, problems)
    named = {s.name for s in selectors(tree)}
    problems.extend(f"{t}: not read as a series" for t in re.findall(r"batchsched_[a-z_]+", expr) if t not in named)
    return problems


def result_labels(expr: str) -> frozenset[str]:
    return labels_of(parse(expr), []) or frozenset()


# -- the dashboard ---------------------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def all_panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    out: list[dict[str, Any]] = []
    for p in board["panels"]:
        out.append(p)
        out.extend(p.get("panels") or [])
    return out


def panel_problems(panel: dict[str, Any]) -> list[str]:
    """What a graph panel lacks, and what is wrong with its expressions."""
    title = panel.get("title") or f"panel {panel.get('id')}"
    problems: list[str] = []
    if (panel.get("datasource") or {}).get("uid") != "${datasource}":
        problems.append(f"{title}: its data source is not the ${{datasource}} variable")
    targets = panel.get("targets") or []
    if not targets:
        problems.append(f"{title}: no targets")
    refs = [t.get("refId") for t in targets]
    if len(set(refs)) != len(refs) or None in refs:
        problems.append(f"{title}: refIds missing or repeated")
    for t in targets:
        if (t.get("datasource") or {}).get("uid") != "${datasource}":
            problems.append(f"{title} {t.get('refId')}: its data source is not ${{datasource}}")
        if not t.get("expr"):
            problems.append(f"{title} {t.get('refId')}: no expression")
            continue
        problems.extend(f"{title} {t.get('refId')}: {p}" for p in expr_problems(t["expr"]))
        legend = str(t.get("legendFormat", ""))
        keep = result_labels(t["expr"]) if not expr_problems(t["expr"]) else frozenset()
        problems.extend(f"{title} {t.get('refId')}: legend names {label}, which the series lost"
                        for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", legend) if label not in keep)
    return problems


def test_the_dashboard_is_grafana_json_with_its_variables() -> None:
    board = dashboard()
    assert board["title"] == "batchsched" and board["uid"] == "batchsched"
    assert 36 <= board["schemaVersion"] <= 41
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    queue = variables["queue"]
    assert queue["type"] == "query" and queue["datasource"]["uid"] == "${datasource}"
    assert queue["query"]["query"] == queue["definition"] == "label_values(batchsched_queue_pending_units, queue)"
    assert "queue" in SERIES["batchsched_queue_pending_units"].labels
    assert queue["includeAll"] and queue["allValue"] == ".*"  # read with queue=~"$queue"
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == ["Cluster", "Queues", "Waits", "Scheduler", "Estimates"]
    panels = all_panels(board)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for p in panels:
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, p["title"]


def test_every_panel_reads_metrics_that_exist() -> None:
    graphs = [p for p in all_panels(dashboard()) if p["type"] != "row"]
    assert len(graphs) >= 15
    assert [problem for p in graphs for problem in panel_problems(p)] == []


def test_the_dashboard_shows_what_an_operator_looks_for() -> None:
    named = set().union(*(metric_names(e) for e in dashboard_expressions()))
    for metric in ("batchsched_gpu_allocation_ratio", "batchsched_gpu_allocated_cards", "batchsched_gpu_free_cards",
                   "batchsched_pending_pods", "batchsched_leader", "batchsched_queue_pending_units",
                   "batchsched_queue_admitted_units", "batchsched_queue_used", "batchsched_queue_nominal",
                   "batchsched_queue_borrowed", "batchsched_queue_stopped", "batchsched_pod_wait_seconds",
                   "batchsched_cycle_duration_seconds", "batchsched_binds_total", "batchsched_evictions_total",
                   "batchsched_reservations", "batchsched_suspended_units",
                   "batchsched_start_estimate_relative_error", "batchsched_start_estimate_error_seconds"):
        assert metric in named, metric


def dashboard_expressions() -> list[str]:
    return [t["expr"] for p in all_panels(dashboard()) for t in p.get("targets") or []]


def test_a_panel_without_data_source_or_targets_is_reported() -> None:
    assert panel_problems({"title": "t", "targets": []}) == [
        "t: its data source is not the ${datasource} variable", "t: no targets",
    ]
    wrong = {"title": "t", "datasource": {"uid": "${datasource}"}, "targets": [
        {"refId": "A", "datasource": {"uid": "${datasource}"}, "expr": "max(batchsched_queue_used)",
         "legendFormat": "{{queue}}"},
    ]}
    assert panel_problems(wrong) == ["t A: legend names queue, which the series lost"]


# -- expressions -----------------------------------------------------------------------------


@pytest.mark.parametrize(("expr", "problem"), [
    ("sum(batchsched_no_such_thing)", "batchsched_no_such_thing: unknown metric"),
    ("batchsched_pending_pods_count", "batchsched_pending_pods_count: batchsched_pending_pods is a gauge, not a histogram"),
    ("rate(batchsched_binds_total_sum[5m])", "batchsched_binds_total_sum: unknown metric"),
    ("batchsched_pod_wait_seconds", "batchsched_pod_wait_seconds is a histogram: read its _bucket, _sum or _count"),
    ("histogram_quantile(0.9, sum by (le) (rate(batchsched_pod_wait_seconds_sum[5m])))",
     "histogram_quantile() over batchsched_pod_wait_seconds_sum, not a _bucket series"),
    ("histogram_quantile(0.9, sum by (queue) (rate(batchsched_pod_wait_seconds_bucket[5m])))",
     "histogram_quantile() over buckets that lost their le label"),
    ("sum by (node) (batchsched_queue_used)", "sum by (node): the series have no label node"),
    ('batchsched_binds_total{reason="preempted"}', "batchsched_binds_total{reason...}: no label reason"),
    ("sum(batchsched_queue_used) by (queue, phase)", "sum by (phase): the series have no label phase"),
    ("rate(batchsched_binds_total)", "rate() needs a range selector"),
    ("max by (queue) (batchsched_queue_used) unless on (resource) batchsched_queue_stopped",
     "unless on (resource): not a label of both sides"),
    ("sum(rate(batchsched_binds_total[5m])", "does not parse: expected , or ), found the end"),
    ("sum(rate(batchsched_binds_total[5 minutes]))", "does not parse: bad range [5 minutes]"),
    ("sumof(batchsched_leader)", "does not parse: unknown function sumof"),
    ('batchsched_leader{job=batchsched}', "does not parse: bad matcher job=batchsched"),
    ('sum(batchsched_leader) < 1 or absent(batchsched_leader{kind="x"})', "batchsched_leader{kind...}: no label kind"),
])
def test_a_wrong_expression_is_reported(expr: str, problem: str) -> None:
    assert problem in expr_problems(expr)


def test_good_expressions_pass_and_keep_their_labels() -> None:
    expr = ('histogram_quantile(0.95, sum by (queue, priority, le) '
            '(rate(batchsched_pod_wait_seconds_bucket{queue=~"$queue"}[$__rate_interval])))')
    assert expr_problems(expr) == []
    assert result_labels(expr) == {"queue", "priority"}
    assert expr_problems('sum(rate(batchsched_binds_total{job="batchsched", result=~"failed|unknown"}[10m])) '
                         '/ sum(rate(batchsched_binds_total[10m])) > 0.05') == []
    assert metric_names("rate(batchsched_pod_wait_seconds_count[5m]) + batchsched_pending_pods") == {
        "batchsched_pod_wait_seconds", "batchsched_pending_pods"}


def test_the_exposition_is_read_from_the_registry() -> None:
    assert SERIES["batchsched_binds_total"] == Series("batchsched_binds", "counter", frozenset({"result"}))
    assert SERIES["batchsched_pod_wait_seconds_bucket"].labels == {"queue", "priority", "le"}
    assert SERIES["batchsched_queue_used"].labels == {"queue", "resource"}
    assert "batchsched_pod_wait_seconds" not in SERIES and "batchsched_binds" not in SERIES


# -- the alert rules -------------------------------------------------------------------------


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "PrometheusRule"
    assert doc["metadata"]["name"] and doc["metadata"]["namespace"] == "batchsched-system"
    groups = doc["spec"]["groups"]
    assert groups and all(g["name"] and g["rules"] for g in groups)
    assert len({g["name"] for g in groups}) == len(groups)
    return [r for g in groups for r in g["rules"]]


def rule_problems(rule: dict[str, Any]) -> list[str]:
    name = rule.get("alert") or "<unnamed>"
    problems = [f"{name}: {p}" for p in expr_problems(str(rule.get("expr", "")))]
    if not re.fullmatch(r"Batchsched[A-Z][A-Za-z]+", name):
        problems.append(f"{name}: alert names start with Batchsched, in CamelCase")
    if not _DURATION.fullmatch(str(rule.get("for", ""))):
        problems.append(f"{name}: no for duration")
    if (rule.get("labels") or {}).get("severity") not in SEVERITIES:
        problems.append(f"{name}: severity is not one of {', '.join(SEVERITIES)}")
    notes = rule.get("annotations") or {}
    problems.extend(f"{name}: no {key}" for key in ("summary", "description") if not str(notes.get(key, "")).strip())
    if not problems:
        keep = result_labels(rule["expr"])
        problems.extend(f"{name}: {{{{ $labels.{label} }}}}, a label the alert does not carry"
                        for text in notes.values() for label in re.findall(r"\$labels\.(\w+)", str(text))
                        if label not in keep)
    return problems


def test_the_alert_rules_are_a_prometheus_rule_that_holds() -> None:
    every = rules()
    names = [r["alert"] for r in every]
    assert len(names) == len(set(names))
    assert [p for r in every for p in rule_problems(r)] == []


def test_the_alerts_cover_what_a_platform_team_pages_on() -> None:
    by_name = {r["alert"]: r for r in rules()}
    exprs = " ".join(r["expr"] for r in by_name.values())
    assert by_name["BatchschedNoLeader"]["labels"]["severity"] == "critical"
    assert re.search(r"sum\(batchsched_leader\{[^}]*\}\) < 1", exprs)
    assert re.search(r"absent\(batchsched_leader\{job=\"batchsched\"\}\)", exprs)  # nothing scraped at all
    assert 'result=~"failed|unknown"' in exprs
    wait = by_name["BatchschedQueueWaitHigh"]["expr"]
    assert "batchsched_pod_wait_seconds_bucket" in wait and "> 3600" in wait
    assert result_labels(wait) == {"queue"}
    stuck = by_name["BatchschedStuck"]["expr"]
    assert {"batchsched_pending_pods", "batchsched_binds_total", "batchsched_gpu_free_cards"} <= metric_names(stuck)
    assert "batchsched_start_estimate_relative_error_bucket" in by_name["BatchschedEstimatesOff"]["expr"]
    assert "> 5" in by_name["BatchschedSlowCycles"]["expr"]


def test_a_wrong_rule_is_reported() -> None:
    rule = {"alert": "BatchschedTest", "expr": "sum(batchsched_leader) < 1", "labels": {"severity": "page"},
            "annotations": {"summary": "s"}}
    assert rule_problems(rule) == [
        "BatchschedTest: no for duration", "BatchschedTest: severity is not one of critical, warning, info",
        "BatchschedTest: no description",
    ]
    rule = {"alert": "BatchschedTest", "expr": "sum(batchsched_leader) < 1", "for": "5m",
            "labels": {"severity": "critical"}, "annotations": {"summary": "{{ $labels.queue }}", "description": "d"}}
    assert rule_problems(rule) == ["BatchschedTest: {{ $labels.queue }}, a label the alert does not carry"]


def test_every_alert_has_promtool_cases_where_it_fires_and_where_it_does_not() -> None:
    cases = yaml.safe_load(ALERT_TESTS.read_text())
    assert cases["rule_files"] == ["alerts.rules.yaml"]
    checks = [c for test in cases["tests"] for c in test["alert_rule_test"]]
    for rule in rules():
        mine = [c for c in checks if c["alertname"] == rule["alert"]]
        assert any(not c["exp_alerts"] for c in mine), f"{rule['alert']}: no case where it stays quiet"
        firing = [a for c in mine for a in c["exp_alerts"]]
        assert firing, f"{rule['alert']}: no case where it fires"
        for alert in firing:
            assert alert["exp_labels"]["severity"] == rule["labels"]["severity"]
            assert alert["exp_annotations"].keys() == rule["annotations"].keys()


# -- the ServiceMonitor ----------------------------------------------------------------------


def test_the_service_monitor_scrapes_the_deployments_metrics_port() -> None:
    deploy = {d["kind"]: d for d in yaml.safe_load_all(DEPLOYMENT.read_text()) if d}["Deployment"]
    service, monitor = (d for d in yaml.safe_load_all(SERVICE_MONITOR.read_text()) if d)
    assert (service["kind"], monitor["kind"]) == ("Service", "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    namespace = deploy["metadata"]["namespace"]
    assert service["metadata"]["namespace"] == monitor["metadata"]["namespace"] == namespace
    pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    [container] = deploy["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    [port] = service["spec"]["ports"]
    assert port["targetPort"] in ports and port["port"] == ports[port["targetPort"]]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [namespace]
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == port["name"] and endpoint["path"] == "/metrics"
    # the job Prometheus gives the series is the Service's name: the one the alerts select
    jobs = {v for r in rules() for s in selectors(parse(r["expr"])) for k, _, v in s.matchers if k == "job"}
    assert jobs == {json.dumps(service["metadata"]["name"])}
