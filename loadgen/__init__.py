"""The load generator and the paper's experiments (SPEC §6, §8).

Traces: ``trace_format`` (JSONL), ``rag_trace`` (zipf_hotspot), ``agent_trace`` with
``agent_material``/``tau2_source`` (agent_prefix), ``corpus``, ``textgen``, ``sampling``.
Replay: ``apis`` (request bodies, stream parsing), ``replay`` (open loop), ``summary``.
Experiments: ``sweep``, ``report``, ``demo``; servers via ``processes``; ``bounds``
(a trace's hit-rate ceilings with an infinite cache). CLI: ``cli``.
"""
