"""Shared by the deploy tests: the repository root and a loader for its scripts (files
outside any package, e.g. `deploy/grafana/build_dashboard.py`, `scripts/cpu_stack.py`)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(path: Path) -> ModuleType:
    """Import a script file as the module named by its stem."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module
