"""The twin: the proxy's admission and the simulated engine in one deterministic run in
modeled time, for traces (``twin``) and for agent sessions (``session_twin``).

Imports ``workloads`` and ``clients``."""
