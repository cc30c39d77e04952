"""Experiments: the sweeps, demos and studies, each built from the rooms below it.

``sweep`` (every line at every QPS, real stack or twin), ``session_sweep`` and
``session_real`` (agent_sessions, their lines in ``session_lines``),
``demo``/``demo_real``, ``twin_vs_real``, ``scale_out`` (replicas behind smg),
``session_flood`` (issue 34)."""
