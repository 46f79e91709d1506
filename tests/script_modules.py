"""The files under ``scripts/`` as modules, so that tests call their functions (they are scripts,
not a package: nothing imports them by name)."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` executed as a fresh module (not put into ``sys.modules``, so each call
    gives its own copy; its ``__name__`` is ``<name>_script``, never ``__main__``)."""
    spec = importlib.util.spec_from_file_location(f"{name}_script", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
