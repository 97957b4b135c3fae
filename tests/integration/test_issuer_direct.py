"""The issuer's lone presses answered by the server as their heads are read
(IssueEdge.direct_answer: a Reply at once, or a Later once the script call is done), on a real
uvicorn server against the real Redis Cluster.

The same presses go to a second issuer served without the lane (its app wrapped by a plain
ASGI callable, so uvicorn runs every request through its cycle and the ASGI call): the answers
must be the same, coupon codes and times aside. Which presses took the ASGI path on the lane's
server is recorded: only the first press of a non-holder after the sell-out (the event's
holders must be loaded, which awaits Redis).
"""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from flashcoupon_common import event_state
from flashcoupon_issuer.app import create_app
from flashcoupon_issuer.http import IssueEdge
from flashcoupon_issuer.issuance import PressArgs
from flashcoupon_issuer.settings import IssuerSettings
from starlette.types import Receive, Scope, Send

from tests.support.issuer import ISSUE, make_spec
from tests.support.raw_http import exchange, serving

_HEAD = re.compile(rb"HTTP/1.1 (\d+) [^\r]*\r\n(.*?)\r\n\r\n", re.S)
_VARYING = {"couponCode", "issuedAt", "expiresAt"}

# (user, Idempotency-Key, other headers) of each press, in order, on an event of 2 coupons.
PRESSES: list[tuple[str | None, str | None, dict[str, str]]] = [
    ("ann", "k1", {}),  # 201
    ("ann", "k1", {}),  # 201, replayed
    ("ann", "k2", {}),  # 409 DUPLICATE
    (None, None, {}),  # 400 MISSING_USER
    ("bob", None, {"X-Flashcoupon-Deadline-Ms": "800"}),  # 201, the last coupon, under a budget
    ("cat", None, {}),  # 410: the holders are loaded first (the ASGI path)
    ("dan", None, {"X-Flashcoupon-Deadline-Ms": "800"}),  # 410, decided here
    ("ann", "k1", {}),  # 201, replayed from this process's cache
    ("eve", None, {"X-Flashcoupon-Allowance-Limit": "nonsense"}),  # 400 MALFORMED_ALLOWANCE
]


class _Plain:
    """The issuer's app without `direct_answer`: every request takes uvicorn's ASGI path."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


async def _press(port: int, event_id: str, user: str | None, key: str | None, **extra: str) -> Any:
    headers = {**extra}
    if user is not None:
        headers["X-Flashcoupon-User"] = user
    if key is not None:
        headers["Idempotency-Key"] = key
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    raw = f"POST {ISSUE.format(event_id)} HTTP/1.1\r\nHost: t\r\n{lines}Content-Length: 0\r\n"
    got = await exchange(port, raw.encode() + b"Connection: close\r\n\r\n")
    match = _HEAD.match(got)
    assert match is not None, got
    names = sorted(line.split(b":")[0].decode() for line in match.group(2).split(b"\r\n"))
    return int(match.group(1)), names, orjson.loads(got[match.end() :])


def _same_shape(body: Any, event_id: str) -> Any:
    """`body` with the event id and what differs between two drops (codes, times) masked."""
    if isinstance(body, dict):
        return {k: "*" if k in _VARYING else _same_shape(v, event_id) for k, v in body.items()}
    if isinstance(body, list):
        return [_same_shape(v, event_id) for v in body]
    return body.replace(event_id, "EV") if isinstance(body, str) else body


async def test_lone_presses_answered_directly_as_through_asgi(
    stack: Any, redis_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    through_asgi: list[tuple[IssueEdge, str]] = []
    pressed = IssueEdge._pressed

    def recorded(self: IssueEdge, scope: Scope, press: PressArgs, budget: int | None) -> Any:
        through_asgi.append((self, press[1]))
        return pressed(self, scope, press, budget)

    monkeypatch.setattr(IssueEdge, "_pressed", recorded)
    settings = IssuerSettings(redis=stack.redis)
    direct, plain = create_app(settings), create_app(settings)
    assert isinstance(direct, IssueEdge) and isinstance(plain, IssueEdge)
    answers: dict[str, list[Any]] = {}
    specs = {"direct": make_spec(2), "plain": make_spec(2)}
    try:
        # Provisioned before the servers start: their supply listeners never hear of it. Heard
        # late (the news crosses the cluster bus, then the listener awaits an EXISTS), it would
        # forget the sell-out the last coupon taught, and cat's press would not take the ASGI
        # path (a CI run saw that).
        for spec in specs.values():
            await event_state.provision(redis_cluster, spec)
        async with serving(direct) as (_, direct_at), serving(_Plain(plain)) as (_, plain_at):
            for name, port in (("direct", direct_at), ("plain", plain_at)):
                event_id = specs[name].event_id
                got = [await _press(port, event_id, u, k, **x) for u, k, x in PRESSES]
                got.append(await _press(port, event_id + "-none", "fay", None))
                codes = [body.get("couponCode") for _, _, body in got]
                assert codes[0] == codes[1] == codes[7] and codes[4] not in (None, codes[0])
                answers[name] = [(s, h, _same_shape(b, event_id)) for s, h, b in got]
    finally:
        for spec in specs.values():
            await event_state.delete_state(redis_cluster, spec.event_id)
    statuses = [status for status, _, _ in answers["direct"]]
    assert statuses == [201, 201, 409, 400, 201, 410, 410, 201, 400, 404]
    assert answers["direct"] == answers["plain"]
    assert [user for edge, user in through_asgi if edge is direct] == ["cat"]
    assert {user for edge, user in through_asgi if edge is plain} >= {"ann", "bob", "dan"}
