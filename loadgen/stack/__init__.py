"""The stack: the servers a line runs, as real subprocesses on loopback, and the lines.

``processes`` starts and stops them, ``cpu_models`` names the CPU server's models,
``peer_lines``/``peers_launch`` the third parties' gateways, ``lines`` the lines of a
comparison (``Line``) and the engine's and proxy's settings of each. Imports ``workloads``
and ``clients``."""
