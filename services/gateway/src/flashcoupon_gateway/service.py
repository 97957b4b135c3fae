"""The gateway's request-level operations, shared by the HTTP routes and the SSE stream.

`Gateway` is built once by the app's lifespan and holds every collaborator. Decisions live in
the modules it wires together (auth, ratelimit/gcra, waiting_room, breaker); this module only
sequences them for one request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from flashcoupon_common import http1, tracing, validation
from flashcoupon_common.event_spec import AdmissionSpec
from flashcoupon_common.holders import Holders
from flashcoupon_common.http import ProblemError, Reply, problem
from flashcoupon_common.issue_batch import ALLOWANCE_LIMIT_HEADER, Press
from redis.exceptions import RedisClusterException, RedisError
from starlette.requests import Request
from starlette.responses import Response

from flashcoupon_gateway import gcra
from flashcoupon_gateway.admission import EventInfo, SpecCache
from flashcoupon_gateway.auth import Authenticator, Principal
from flashcoupon_gateway.issue_batch import AllowanceRefused, IssueBatcher
from flashcoupon_gateway.metrics import QUEUED, SHED
from flashcoupon_gateway.ratelimit import Check, Outcome, RateLimiter, ip_key, user_key
from flashcoupon_gateway.settings import GatewaySettings
from flashcoupon_gateway.sold_out import SoldOutBoard, Unsettled
from flashcoupon_gateway.upstream import Answer, Forwarder, invalid_characters, unavailable
from flashcoupon_gateway.waiting_room import RoomAnswer, TicketState, WaitingRoom

USER_HEADER = "X-Flashcoupon-User"
# Redis unreachable or too slow (the batcher's deadline): fail closed with a 503.
STORE_ERRORS: tuple[type[Exception], ...] = (
    RedisError,
    RedisClusterException,  # not a RedisError subclass
    TimeoutError,
    ConnectionError,
)
logger = logging.getLogger(__name__)
_FORWARDED = tuple((n, n.encode()) for n in ("traceparent", "tracestate", "x-request-id"))
# How long the gateway decides shoppers' limits itself after an issuer showed it does not
# (an older issuer during a rollout, or its allowance switched off); then it tries again.
ALLOWANCE_REFUSED_S = 60.0


def store_unavailable(path: str, exc: Exception) -> Response:
    # Limits and queues live in Redis: without it the gateway refuses (fail closed) rather than
    # admitting unlimited traffic; the issuer could not issue without Redis either.
    logger.warning("redis unavailable on %s: %r", path, exc)
    SHED.labels("redis_unavailable").inc()
    return problem(
        503,
        "SERVICE_UNAVAILABLE",
        "rate-limit store unreachable; retry",
        headers={"Retry-After": "1"},
    )


def sold_out(event_id: str) -> ProblemError:
    # The issuer's words for it (flashcoupon_issuer.http), so both answers read the same.
    return ProblemError(410, "SOLD_OUT", f"event {event_id} is sold out")


# Path parameters are checked before anything is forwarded: a malformed id is a 400, never
# bytes written into an upstream request line.
checked_event_id = validation.event_id
checked_code = validation.coupon_code


_HEADERS = "flashcoupon.headers"  # where header_value keeps a request's headers by name


def header_value(request: Request, name: bytes) -> str | None:
    """The first value of the header `name` (lower case), as `request.headers.get` returns it.

    The request's headers are read into a dict once, in one pass, and kept in its scope:
    Starlette's `get` raises and catches a KeyError for every absent header (~1 us each), and
    a press asks for six that it seldom carries."""
    scope = request.scope
    headers = scope.get(_HEADERS)
    if headers is None:
        headers = scope[_HEADERS] = dict(reversed(scope["headers"]))  # the first one wins
    value = headers.get(name)
    return None if value is None else value.decode("latin-1")


def client_ip(request: Request, trusted_proxies: int) -> str:
    """The client's address: the peer, or the entry `trusted_proxies` hops from the right."""
    client = request.scope.get("client")  # (host, port): `request.client` makes an Address
    peer = client[0] if client else "unknown"
    if trusted_proxies <= 0:
        return peer
    forwarded = header_value(request, b"x-forwarded-for") or ""
    hops = [h.strip() for h in forwarded.split(",") if h.strip()]
    return hops[-trusted_proxies] if len(hops) >= trusted_proxies else peer


def upstream_headers(request: Request, user: str) -> dict[str, str]:
    """Headers for an upstream call: the user id from the verified token, never the client's.

    A forwarded value with a control character is a 400 INVALID_CHARACTERS here, whether the
    call then writes it as a header or carries the press in a batch (which drops the values
    the issuer does not read): one rule for both ways of forwarding."""
    headers = {USER_HEADER: user}
    for name, raw_name in _FORWARDED:
        value = header_value(request, raw_name)
        if value is not None and len(value) <= 512:
            try:
                http1.check_header_value(name, value)
            except http1.UnsafeRequestError as exc:
                raise invalid_characters(exc) from None
            headers[name] = value
    key = validation.idempotency_key(header_value(request, b"idempotency-key"))
    if key is not None:
        headers["Idempotency-Key"] = key
    if tracing.ENABLED:
        tracing.inject(headers)  # the issuer's span is a child of the gateway's, if one runs
    return headers


def carries_allowance(info: EventInfo) -> bool:
    """Whether the issuer decides the shopper's per-event limit with the issue (issue.lua,
    one script call for both) instead of the gateway asking Redis first.

    Only when nothing the gateway does after that check depends on its verdict: a known event
    (an unknown one is refused by the issuer anyway, and leaves no limiter state), without a
    waiting room (a queue ticket must not be handed to a refused shopper) and without an event
    cap (a press the shopper's limit refuses must not spend the event's admissions).
    """
    spec = info.spec
    return (
        spec is not None
        and not spec.admission.waiting_room_enabled
        and not spec.admission.max_per_second
    )


class _Slot:
    """`with gateway.slot():` (a plain class, and not an async one: taking and giving back a
    slot awaits nothing, and each await of a press costs its coroutine)."""

    __slots__ = ("g",)

    def __init__(self, g: Gateway) -> None:
        self.g = g

    def __enter__(self) -> None:
        if self.g.in_flight >= self.g.settings.max_in_flight:
            raise unavailable("the gateway is overloaded; retry shortly", 1, "in_flight")
        self.g.in_flight += 1

    def __exit__(self, *exc: object) -> None:
        self.g.in_flight -= 1


# The result of a press, one per request: NamedTuples (cheaper than frozen dataclasses).
class Forwarded(NamedTuple):
    """A press the issuer answered; `limits` are the rate-limit outcomes for the headers."""

    answer: Answer
    limits: list[Outcome]


class Queued(NamedTuple):
    """A press given a waiting-room ticket (the 202 body)."""

    body: dict[str, Any]
    limits: list[Outcome]


@dataclass
class Gateway:
    settings: GatewaySettings
    auth: Authenticator
    limiter: RateLimiter
    room: WaitingRoom
    specs: SpecCache
    upstream: Forwarder
    # The process's sell-out knowledge (also read by `room`): heard on the event channels and
    # confirmed by every spec read; never learned from the issuer's answers.
    sold_out: SoldOutBoard
    # Who holds a coupon of a sold-out event: only others get the edge's 410 (None: nobody).
    holders: Holders | None = None
    # Presses to the issuers go in batches (None: one request each, ISSUE_BATCH_MAX=0).
    batcher: IssueBatcher | None = None
    in_flight: int = field(default=0)
    # Shoppers answered 503 on an issue: their retry goes to the issuer even after a sell-out.
    unsettled: Unsettled = field(default_factory=Unsettled)
    # event -> (fetched at, answer) of GET /v1/events/{id}: public state may be approximate.
    event_cache: dict[str, tuple[float, Answer]] = field(default_factory=dict)
    _sold_out_answers: dict[str, Reply] = field(default_factory=dict)
    # Until then (time.monotonic()), presses carry no allowance: an issuer did not decide one.
    allowances_refused_until: float = 0.0

    @property
    def route_batches(self) -> bool:
        """Whether the batcher picks each batch's issuer (ISSUER_ROUTING=batch)."""
        return self.batcher is not None and self.settings.issuer_routing == "batch"

    def slot(self) -> _Slot:
        """Bounded in-flight upstream calls per process: over the bound, 503 at once."""
        return _Slot(self)

    async def principal(self, request: Request) -> Principal:
        return await self.auth.authenticate(header_value(request, b"authorization"))

    def client_ip(self, request: Request) -> str:
        """The shopper's address: the peer, or X-Forwarded-For behind trusted proxies."""
        return client_ip(request, self.settings.limits.trusted_proxies)

    def ip_check(self, ip: str) -> Check:
        lim = self.settings.limits
        return Check("ip", ip_key(ip), gcra.limit(lim.ip_per_second, lim.ip_burst))

    def client_checks(self, ip: str, user_check: Check) -> list[Check]:
        return [self.ip_check(ip), user_check]

    async def press(
        self, event_id: str, user: str, ip: str, headers: dict[str, str]
    ) -> Forwarded | Queued:
        """The whole issue flow for an authenticated press: sold-out at the edge, rate limits,
        admission or a waiting-room ticket, then the issuer's answer."""
        info = self.specs.cached(event_id) or await self.specs.get(event_id)
        if self.sold_out.is_sold_out(event_id):
            await self.check_sold_out(event_id, headers)
        outcomes, queued, carried = await self.admit_issue(ip, event_id, user, info)
        if queued is not None:
            return Queued(self.queued_body(event_id, user, queued, info), outcomes)
        if carried is None:
            return Forwarded(await self.issue(event_id, headers), outcomes)
        asked_at = time.monotonic()
        try:
            answer = await self.issue(event_id, headers, carried)
        except AllowanceRefused:
            # The issuer issued nothing: the shopper's limit is decided here, as for an event
            # with a cap, and the press sent again without it.
            outcomes += await self.limiter.check_all([[carried]])
            return Forwarded(await self.issue(event_id, headers), outcomes)
        if answer.allowance is not None:
            outcomes.append(self.limiter.allowance_outcome(carried, answer.allowance, asked_at))
        elif answer.status in (201, 409) and answer.header(b"idempotent-replayed") is None:
            # The script decided this press (a new coupon or DUPLICATE) yet said nothing of
            # the allowance: an issuer that ignores it (a lone press to an older issuer). This
            # press went unlimited; the next ones are limited here.
            self.refuse_allowances(f"the issuer answered {answer.status} without it")
        return Forwarded(answer, outcomes)

    def allowances_refused(self) -> bool:
        """Whether an issuer lately did not decide an allowance (presses then carry none)."""
        return time.monotonic() < self.allowances_refused_until

    def refuse_allowances(self, why: str) -> None:
        """Decide shoppers' limits here for ALLOWANCE_REFUSED_S: an issuer does not."""
        if not self.allowances_refused():
            logger.warning(
                "an issuer does not decide allowances (%s): shoppers' limits are decided by "
                "the gateway for %.0f s",
                why,
                ALLOWANCE_REFUSED_S,
            )
        self.allowances_refused_until = time.monotonic() + ALLOWANCE_REFUSED_S

    def api_user_check(self, user: str) -> Check:
        lim = self.settings.limits
        return Check("user", user_key(user, "api"), gcra.limit(lim.user_per_second, lim.user_burst))

    async def admit_issue(
        self, ip: str, event_id: str, user: str, info: EventInfo
    ) -> tuple[list[Outcome], RoomAnswer | None, Check | None]:
        """Rate limits and admission for an issue request: the outcomes so far, a RoomAnswer
        when it was queued, and the shopper's own check when the issuer is to decide it with
        the issue (`carries_allowance`)."""
        adm = info.spec.admission if info.spec is not None else AdmissionSpec()
        per_user = gcra.limit(adm.per_user_per_second, adm.per_user_burst)
        user_check = Check("user", user_key(user, "ev:" + event_id), per_user)
        if carries_allowance(info) and not self.allowances_refused():
            self.limiter.refuse_if_denied(user_check)  # refused lately: 429 here, no call
            ip_only = [self.ip_check(ip)]
            return await self.limiter.check_all([ip_only]), None, user_check
        client = self.client_checks(ip, user_check)
        if info.spec is not None and adm.waiting_room_enabled:
            # A holder's retry (after a 201, or a 503 whose coupon was issued) skips the room:
            # the issuer answers it with the coupon (a keyed replay or DUPLICATE), at once and
            # without spending an admission. Read beside the limits: no extra wait.
            outcomes, holder = await asyncio.gather(
                self.limiter.check_all([client]), self.room.holds(event_id, user)
            )
            if holder:
                return outcomes, None, None
            rate = float(adm.waiting_room_admit_per_second)
            answer = await self.room.enter(event_id, user, rate, info.start_ms)
            if answer.state is TicketState.SOLD_OUT:
                raise sold_out(event_id)
            if answer.state is TicketState.QUEUED:
                QUEUED.labels(event_id).inc()
                return outcomes, answer, None
            return outcomes, None, None
        stages = [client]
        if info.spec is not None and adm.max_per_second:
            stages.append([self.limiter.event_check(event_id, adm.max_per_second)])
        return await self.limiter.check_all(stages), None, None

    async def check_sold_out(self, event_id: str, headers: dict[str, str]) -> None:
        """410 SOLD_OUT for a press of a sold-out event: no rate-limit call, no issuer call.

        Only to shoppers known to hold nothing: every holder of a coupon of the event is
        forwarded (its holders are loaded once per sell-out), with or without an
        Idempotency-Key — a holder whose answer was lost (a timeout, a 503 from another
        replica) is told their coupon by the issuer (a keyed replay, or 409 DUPLICATE). So are
        shoppers this process answered 503. A keyed press of someone holding nothing gets the
        410 here: the issuer could not have issued them anything either.
        """
        user = headers[USER_HEADER]
        if (
            self.sold_out.is_sold_out(event_id)
            and (event_id, user) not in self.unsettled
            and self.holders is not None
            and await self.holders.holds_nothing(event_id, user)
        ):
            raise sold_out(event_id)

    def answers_sold_out_now(self, event_id: str, authorization: str | None) -> bool:
        """Whether a body-less press of `event_id` gets 410 SOLD_OUT at once, decided without
        awaiting anything (the sold-out lane, fastpath.sold_out_now): the event is sold out,
        its state was read within the spec cache's ttl (so a re-opening the channels missed
        is still noticed by the next full press), the token verifies synchronously, and the
        shopper holds nothing and was not answered 503 here. Any doubt (no cached holders, a
        JWKS token, a bad token) is False: the full path decides, with the same rules."""
        if not self.sold_out.is_sold_out(event_id) or self.specs.cached(event_id) is None:
            return False
        holders = None if self.holders is None else self.holders.cached(event_id)
        if holders is None:
            return False
        try:
            principal = self.auth.authenticate_now(authorization)
        except ProblemError:
            return False  # the full path answers the 401
        return (
            principal is not None
            and principal.user_id not in holders
            and (event_id, principal.user_id) not in self.unsettled
        )

    def sold_out_answer(self, event_id: str) -> Reply:
        """The 410 for a sold-out event, rendered once (a Reply holds no per-request state and
        can be sent again; the crowd after a sell-out all get this one)."""
        answer = self._sold_out_answers.get(event_id)
        if answer is None:
            if len(self._sold_out_answers) >= 256:
                self._sold_out_answers.clear()
            exc = sold_out(event_id)
            answer = Reply.of_response(problem(exc.status, exc.code, exc.detail))
            self._sold_out_answers[event_id] = answer
        return answer

    async def issue(
        self, event_id: str, headers: dict[str, str], allowance: Check | None = None
    ) -> Answer:
        """The issuer's answer to the press; with `allowance`, the issuer decides that check
        (the shopper's per-event limit) with the issue and says so in `Answer.allowance`."""
        user = headers[USER_HEADER]
        limit = None if allowance is None else allowance.limit
        if limit is not None and self.allowances_refused():
            raise AllowanceRefused("refused lately")  # learned while this press was admitted
        try:
            with self.slot():
                # "batch" routing leaves the choice to the batcher (None): one issuer per loop
                # turn's batch rather than the turn's presses split by shopper.
                up = None if self.route_batches else self.upstream.pick_issuer(affinity=user)
                if self.batcher is not None:
                    press = Press(
                        event_id,
                        user,
                        headers.get("Idempotency-Key"),
                        headers.get("traceparent"),
                        None if limit is None else (limit.interval_us, limit.burst),
                    )
                    answer = await self.batcher.issue(up, press)
                else:
                    assert up is not None  # route_batches needs a batcher
                    if limit is not None:
                        headers = {
                            **headers,
                            ALLOWANCE_LIMIT_HEADER: f"{limit.interval_us} {limit.burst}",
                        }
                    answer = await self.upstream.call(
                        up, "POST", f"/internal/v1/events/{event_id}/issue", headers
                    )
        except ProblemError as exc:
            if exc.status == 503:
                self.unsettled.add(event_id, user)
            raise
        except AllowanceRefused as exc:
            self.refuse_allowances(f"{exc}: a batch with allowances was refused")
            if allowance is not None:
                raise
            # Refused for another press's allowance: this one carried none; sent again.
            return await self.issue(event_id, headers)
        if answer.status == 503:
            self.unsettled.add(event_id, user)
        return answer

    def queued_body(
        self, event_id: str, user: str, answer: RoomAnswer, info: EventInfo
    ) -> dict[str, Any]:
        assert info.spec is not None
        ticket = self.room.ticket(event_id, user, answer.n)
        rate = float(info.spec.admission.waiting_room_admit_per_second)
        return {
            "status": "QUEUED",
            "code": "QUEUED",
            "ticket": ticket,
            "position": answer.position,
            "etaSeconds": answer.eta_seconds(rate, info.start_ms),
            "statusUrl": f"/v1/events/{event_id}/queue/{ticket}",
        }
