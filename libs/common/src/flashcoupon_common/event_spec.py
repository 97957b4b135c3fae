"""A CouponEvent's spec as the services use it: validated, typed, times as aware datetimes.

`flashcoupon_operator.manifest` builds it from a manifest (YAML of the CouponEvent custom
resource); the Redis provisioning (`event_state`), the catalog writer and the gateway's admission
settings read it. `tier_quantities` is the one place the per-tier totals are decided.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

import orjson

from flashcoupon_common.messages import Discount


@dataclass(frozen=True, slots=True)
class TierSpec:
    name: str
    discount: Discount
    share: int  # percent of the event's quantity; shares of an event sum to 100


@dataclass(frozen=True, slots=True)
class AdmissionSpec:
    """The gateway's admission settings for one event (CouponEvent `spec.admission`)."""

    max_per_second: int | None = None
    per_user_per_second: float = 2.0
    per_user_burst: int = 5
    waiting_room_enabled: bool = False
    waiting_room_admit_per_second: int = 2000


@dataclass(frozen=True, slots=True)
class EventSpec:
    event_id: str  # metadata.name: a DNS-1123 label, also the Redis hash tag and MySQL key
    title: str
    quantity: int
    start_at: datetime
    end_at: datetime
    tiers: tuple[TierSpec, ...]
    per_user_limit: int = 1
    warmup: timedelta = timedelta(minutes=10)
    valid_for: timedelta = timedelta(hours=720)
    admission: AdmissionSpec = field(default_factory=AdmissionSpec)

    def tier_quantities(self) -> dict[str, int]:
        """Exact coupons per tier: floor of the share, remainders by largest fraction.

        Sums to `quantity` exactly; ties go to the earlier tier, so the split is deterministic.
        """
        exact = [(t.name, self.quantity * t.share) for t in self.tiers]
        counts = {name: whole // 100 for name, whole in exact}
        left = self.quantity - sum(counts.values())
        by_remainder = sorted(range(len(exact)), key=lambda i: -(exact[i][1] % 100))
        for i in by_remainder[:left]:
            counts[exact[i][0]] += 1
        return counts

    # ---- JSON form: stored in Redis (event config) and MySQL (coupon_events.spec)
    def to_json(self) -> bytes:
        a = self.admission
        return orjson.dumps(
            {
                "eventId": self.event_id,
                "title": self.title,
                "quantity": self.quantity,
                "perUserLimit": self.per_user_limit,
                "startAt": self.start_at.isoformat(),
                "endAt": self.end_at.isoformat(),
                "warmupSeconds": self.warmup.total_seconds(),
                "validForSeconds": self.valid_for.total_seconds(),
                "tiers": [
                    {"name": t.name, "discount": t.discount.to_json(), "share": t.share}
                    for t in self.tiers
                ],
                "admission": {
                    "maxPerSecond": a.max_per_second,
                    "perUser": {"perSecond": a.per_user_per_second, "burst": a.per_user_burst},
                    "waitingRoom": {
                        "enabled": a.waiting_room_enabled,
                        "admitPerSecond": a.waiting_room_admit_per_second,
                    },
                },
            }
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> EventSpec:
        d = orjson.loads(raw)
        a = d["admission"]
        return cls(
            event_id=d["eventId"],
            title=d["title"],
            quantity=d["quantity"],
            per_user_limit=d["perUserLimit"],
            start_at=datetime.fromisoformat(d["startAt"]),
            end_at=datetime.fromisoformat(d["endAt"]),
            warmup=timedelta(seconds=d["warmupSeconds"]),
            valid_for=timedelta(seconds=d["validForSeconds"]),
            tiers=tuple(
                TierSpec(t["name"], Discount.from_json(t["discount"]), t["share"])
                for t in d["tiers"]
            ),
            admission=AdmissionSpec(
                max_per_second=a["maxPerSecond"],
                per_user_per_second=a["perUser"]["perSecond"],
                per_user_burst=a["perUser"]["burst"],
                waiting_room_enabled=a["waitingRoom"]["enabled"],
                waiting_room_admit_per_second=a["waitingRoom"]["admitPerSecond"],
            ),
        )
