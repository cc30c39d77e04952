"""DART, the Demand-Aware Radix Tree (SPEC §3): pure Python, never imports sglang, so
the SGLang plugin and the simulated engine run the very same code."""

from backend_plugin.dart.core import DartCore, DartStats
from backend_plugin.dart.keys import EvictionClass, EvictionPolicy, NodeMeta, eviction_key
from backend_plugin.dart.priority import PriorityUpdate, StaleEpochError, UpdateInbox
from backend_plugin.dart.tree import META_ATTR, DartStrategy, TreeAdapter, place_anchors

__all__ = [
    "META_ATTR",
    "DartCore",
    "DartStats",
    "DartStrategy",
    "EvictionClass",
    "EvictionPolicy",
    "NodeMeta",
    "PriorityUpdate",
    "StaleEpochError",
    "TreeAdapter",
    "UpdateInbox",
    "eviction_key",
    "place_anchors",
]
