"""`make demo`: until the services exist, report the running stack and what is built so far."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def main() -> int:
    print("flashcoupon demo: the local stack is up (make stack-up ran before this).")
    status = subprocess.run([str(ROOT / "scripts" / "stack.sh"), "status"], check=False)
    print("\nBuilt so far: the local stack, the shared library (settings, message schema, MySQL")
    print("schema + migrations). The coupon drop itself arrives with the issuer, gateway and")
    print("persister issues; see docs/ and `make help`.")
    return status.returncode


if __name__ == "__main__":
    sys.exit(main())
