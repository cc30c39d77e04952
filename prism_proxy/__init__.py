"""PRISM admission proxy: QAS rounds in front of SGLang (SPEC §1, §2, §4)."""

__version__ = "0.1.0"
