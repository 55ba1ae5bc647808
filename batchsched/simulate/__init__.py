"""Replay: the production scheduling session on a virtual clock (see :mod:`.engine`)."""
