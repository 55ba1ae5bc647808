"""The books the :class:`~batchsched.core.session.Session` conducts, one owner each.

Each book is a small class whose fields only its own module writes; no book imports another
or the session (an import-linter contract says so). They exchange values (pods, units, a
plan, classes to wake or tell) that the session routes:

- :mod:`~batchsched.core.books.intake`: each pod as read (arrivals, health, claims);
- :mod:`~batchsched.core.books.backlog`: which units are awake and handed to a cycle;
- :mod:`~batchsched.core.books.told`: what each pod and class was told;
- :mod:`~batchsched.core.books.ledger`: assumed pods, pods in doubt, stale cleanups;
- :mod:`~batchsched.core.books.holds`: gang timers, suspended, drained, unhealthy work;
- :mod:`~batchsched.core.books.followup`: the Events and evictions of preemptions;
- :mod:`~batchsched.core.books.nominations`: the capacity held for preemptors, birth to end;
- :mod:`~batchsched.core.books.statuses`: PodGroup and Queue statuses.
"""
