"""The load generator and the paper's experiments (SPEC §6, §8), in rooms by job.

Each room imports only rooms listed above it here, never one below:

* ``workloads``: the traces (zipf_hotspot, agent_prefix, reorder_replay, agent_sessions),
  their file format, knobs and seeded draws, and a trace's hit-rate ceilings.
* ``clients``: how a trace is sent to a target and read back: request bodies, the
  open-loop and closed-loop replays, routing keys, per-request records.
* ``stack``: the servers a line runs as subprocesses (proxy, prism-sim, SGLang, peer
  gateways), and ``lines``: the one type of a line of a comparison, ``Line``, with the
  real stack's settings of a line.
* ``twin``: proxy admission and the simulated engine in modeled time, and a line's
  twin setup (``line_setup``).
* ``reports``: the sweep report (markdown table, plots, intervals).
* ``experiments``: sweeps, demos and studies built from the rooms above.
* ``quality``: answer quality by document order.

``cli`` is ``prism-loadgen``; it reaches every room.
"""
