"""Which miita_edge the campaigns and their child processes import (shared by the campaign modules)."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path


def package_parent() -> Path:
    """The directory holding the miita_edge that this Python imports: the installed package (with
    its compiled extension), or the checkout's python/ when that is what is on the path (dev runs
    with PYTHONPATH). Never the checkout's sources in front of an installed package: they have no
    compiled extension."""
    spec = importlib.util.find_spec("miita_edge")
    if spec is None or not spec.origin:
        return Path(__file__).resolve().parents[2] / "python"
    return Path(spec.origin).resolve().parent.parent


PYDIR = package_parent()
if str(PYDIR) not in sys.path:
    sys.path.insert(0, str(PYDIR))


def child_env() -> dict:
    """This process's environment with PYDIR first on PYTHONPATH, for a child that imports miita_edge."""
    return dict(os.environ, PYTHONPATH=str(PYDIR) + os.pathsep + os.environ.get("PYTHONPATH", ""))
