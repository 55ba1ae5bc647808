"""batchsched's perf suite: live runs against peers, the bind ceiling, cycle and kernel benchmarks.

Run it with ``python -m perf`` (see ``perf/README.md``); results go to ``perf/results/``.
"""
