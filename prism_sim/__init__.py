"""prism-sim: an SGLang-compatible simulated engine (SPEC §7); see docs/simulated-engine.md."""
