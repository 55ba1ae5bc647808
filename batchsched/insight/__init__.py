"""What batchsched can tell people about the work it holds: why a job waits and when it
will start (:mod:`~batchsched.insight.explain`), the job, queue and node views the CLI and
the web view show (:mod:`~batchsched.insight.views`), and start-time estimates made by
running a copy of the scheduling session forward on a virtual clock
(:mod:`~batchsched.insight.estimate`).

Pure, like :mod:`batchsched.core`: it reads a :class:`~batchsched.core.session.Session`
and the time it is given, and returns plain dicts (the JSON the endpoints serve). The
wording lives in :mod:`batchsched.core.explain`.
"""
