"""The twin: the proxy's admission and the simulated engine in one deterministic run in
modeled time, for traces (``twin``) and for agent sessions (``session_twin``), and the
twin's setup of a line (``line_setup``).

Imports ``workloads``, ``clients`` and ``stack`` (its ``lines``)."""
