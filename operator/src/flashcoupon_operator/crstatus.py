"""The CouponEvent `status` the operator writes: phase, counters and conditions, as one dict.

A pure function, so the operator's handlers only fetch and patch. Two details matter:
* kopf patches status with a JSON merge patch, which replaces lists whole, so every call
  returns the complete `conditions` list, never a delta;
* a condition's `lastTransitionTime` changes only when its status flips, so it is carried over
  from the previous status; otherwise every refresh would look like a transition.

Conditions: `Preloaded` (Redis holds the event's state) and `SpecAccepted` (the last applied
generation was accepted; False with the refusal as message when a change was refused — the
event keeps running with the spec it had).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from flashcoupon_operator.model import EventStatus
from flashcoupon_operator.reconcile import Plan


def _time(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def condition(
    kind: str,
    ok: bool,
    reason: str,
    message: str,
    *,
    generation: int,
    now: datetime,
    previous: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    status = "True" if ok else "False"
    before = next((c for c in previous if c.get("type") == kind), None)
    since = (
        before["lastTransitionTime"]
        if before and before.get("status") == status and before.get("lastTransitionTime")
        else _time(now)
    )
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
        "observedGeneration": generation,
    }


def cr_status(
    *,
    event: EventStatus | None,
    plan: Plan | None,
    error: str | None,
    generation: int,
    now: datetime,
    previous: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The full status for one reconcile.

    `event` is what runtime.status read (None if nothing could be read), `plan` the last plan
    (None if none was made), `error` a failure of the apply itself (Redis or MySQL down, ...).
    """
    prior = list((previous or {}).get("conditions") or [])
    out: dict[str, Any] = {"observedGeneration": generation}
    preloaded = event is not None and event.issued is not None
    if event is not None:
        out.update(
            quantity=event.quantity,
            issued=event.issued,
            remaining=event.remaining,
            persisted=event.persisted,
            paused=event.paused,
        )
        if event.phase is not None:  # None: the catalog row is marked deleted
            out["phase"] = event.phase
    if error is not None:
        out["phase"] = "Failed"
        out["message"] = error
    elif plan is not None and plan.rejected:
        out["message"] = plan.rejection
    elif plan is not None and plan.preload_at is not None and not preloaded:
        out["preloadAt"] = _time(plan.preload_at)
        out["message"] = f"preload at {_time(plan.preload_at)}"
    else:
        out["message"] = ""

    if preloaded:
        loaded = condition(
            "Preloaded",
            True,
            "Preloaded",
            "runtime state is in Redis",
            generation=generation,
            now=now,
            previous=prior,
        )
    elif error is not None:
        loaded = condition(
            "Preloaded", False, "Failed", error, generation=generation, now=now, previous=prior
        )
    else:
        loaded = condition(
            "Preloaded",
            False,
            "Waiting",
            out.get("message") or "not preloaded yet",
            generation=generation,
            now=now,
            previous=prior,
        )
    if plan is not None and plan.rejected:
        accepted = condition(
            "SpecAccepted",
            False,
            "Rejected",
            plan.rejection or "",
            generation=generation,
            now=now,
            previous=prior,
        )
    elif error is not None:
        accepted = condition(
            "SpecAccepted",
            False,
            "ApplyFailed",
            error,
            generation=generation,
            now=now,
            previous=prior,
        )
    else:
        changes = "; ".join(plan.changes) if plan is not None else ""
        accepted = condition(
            "SpecAccepted",
            True,
            "Applied",
            changes or "no change",
            generation=generation,
            now=now,
            previous=prior,
        )
    out["conditions"] = [loaded, accepted]
    return out
