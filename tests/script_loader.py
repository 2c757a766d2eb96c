"""Load one of the project's stand-alone scripts (jobs/...) as a module, by path, for in-process tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def load_script(relative_path: str, module_name: str) -> ModuleType:
    """The script at ROOT/relative_path as module `module_name`, executed once per test session."""
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, ROOT / relative_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # registered first: dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module
