"""Where things are: the repository root and the workspace's console scripts."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Console scripts of the workspace's services (same venv as the interpreter running pytest).
BIN = Path(sys.executable).parent
