"""localrun.batch_scheduling: the demo and every process it starts run under SCHED_BATCH."""

from __future__ import annotations

import os
import subprocess
import sys

# In a child process: the policy is per process and inherited, and pytest's own must not change.
CHILD = """
import os, subprocess, sys
from flashcoupon_loadtest.localrun import batch_scheduling
os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))  # whatever pytest runs under
assert batch_scheduling() is True
grandchild = subprocess.run(
    [sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"],
    capture_output=True, text=True, check=True,
)
print(os.sched_getscheduler(0), grandchild.stdout.strip())
"""


def test_batch_scheduling_holds_for_the_process_and_what_it_starts() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == [str(os.SCHED_BATCH)] * 2
