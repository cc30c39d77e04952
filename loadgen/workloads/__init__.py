"""Workloads: the traces, their JSONL format, their knobs and their seeded draws (SPEC §6).

Imports nothing else of loadgen."""
