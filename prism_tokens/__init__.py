"""Tokenization shared by the proxy, the simulated engine, loadgen and the CPU SGLang server."""
