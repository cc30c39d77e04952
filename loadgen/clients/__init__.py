"""Clients: how a trace's requests are sent to a target and their answers read.

Request bodies per API (``apis``), the open-loop replay (``replay``), the closed-loop
session replay (``session_replay``), routing keys (``routing``, ``hot_keys``,
``smg_ring``) and per-request records (``summary``). Imports ``workloads`` only."""
