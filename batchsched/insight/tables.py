"""The views as kubectl-style tables (``batchsched jobs``, ``batchsched queues``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from batchsched.core import explain

__all__ = ["jobs_table", "queues_table"]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [list(header), *rows]]
    return "\n".join(lines)


def _ago(seconds: float | None) -> str:
    return "-" if seconds is None else explain.about(seconds)


def _start(row: Mapping[str, Any]) -> str:
    if row["state"] == "running":
        return "-"
    e = row["estimate"]
    if e["start"] is None:
        return "unknown"
    return "now" if e["inSeconds"] < 1 else f"in ~{explain.about(e['inSeconds'])}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def jobs_table(rows: Sequence[Mapping[str, Any]], *, namespaces: bool = True) -> str:
    header = [*(["NAMESPACE"] if namespaces else []), "NAME", "KIND", "API", "QUEUE", "STATE", "BOUND", "GPUS",
              "WAIT", "POSITION", "START"]
    body = []
    for r in rows:
        m = r["members"]
        body.append([
            *([r["namespace"]] if namespaces else []), r["name"], r["kind"], r.get("api") or "-", r["queue"] or "-", r["state"],
            f"{m['bound']}/{m['required']}", _num(r["gpus"]), _ago(r["wait"]),
            "-" if r["position"] is None else f"{r['position']}/{r['queueLength']}", _start(r),
        ])
    return _table(header, body)


def queues_table(rows: Sequence[Mapping[str, Any]]) -> str:
    header = ["NAME", "PARENT", "STATE", "RESOURCE", "NOMINAL", "USED", "BORROWED", "LENT", "PENDING",
              "ADMITTED", "SHARE", "OLDEST WAIT"]
    body = []
    for q in rows:
        res = q["resources"][0] if q["resources"] else None
        body.append([
            q["name"], q["parent"] or "-", q["state"], res["name"] if res else "-",
            "-" if res is None else ("unlimited" if res["nominal"] is None else _num(res["nominal"])),
            _num(res["used"]) if res else "-", _num(res["borrowed"]) if res else "-",
            _num(res["lent"]) if res else "-", str(q["pending"]), str(q["admitted"]),
            "-" if q["fairShare"] is None else f"{q['fairShare']:.2f}", _ago(q["oldestWait"]),
        ])
    return _table(header, body)
