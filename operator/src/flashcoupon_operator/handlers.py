"""The kopf operator for CouponEvents: thin handlers around `runtime` and `crstatus`.

    kopf run -m flashcoupon_operator.handlers --all-namespaces --liveness=http://0.0.0.0:8085/healthz
    # or: python -m flashcoupon_operator

One concept per handler: `apply` (create / spec update / operator restart) plans and applies the
spec; `refresh` (a timer) preloads an event whose warm-up has come and keeps the status counters
fresh; `cleanup` (on delete, behind the project finalizer) drops the Redis state and marks the
catalog row. Activation and end need no timer: the issue script checks the window itself from
Redis server time, so the doors open on the second even if the operator is down. Only the
status's Active needs care: `refresh` wakes at startAt when it falls between two ticks, or a
drop that sells out within one tick would go Ready → SoldOut without ever showing Active.

Errors: an invalid or refused spec is reported in status (`SpecAccepted=False`) and not retried
(the running event keeps its old spec); Redis/MySQL failures are `TemporaryError`s retried by
kopf, with `phase: Failed` meanwhile. A delete waits while issued coupons are not in MySQL yet,
unless the object carries the annotation `flashcoupon.io/force-delete: "true"`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from typing import Any

import kopf
from flashcoupon_common.db.engine import create_engine
from flashcoupon_common.redis_cluster import create_redis_cluster
from flashcoupon_common.settings import MysqlSettings, RedisSettings, env_float
from redis.exceptions import RedisClusterException, RedisError
from sqlalchemy.exc import SQLAlchemyError

from flashcoupon_operator import metrics, runtime
from flashcoupon_operator.crstatus import cr_status
from flashcoupon_operator.manifest import API_VERSION, KIND, ManifestError, parse_manifest
from flashcoupon_operator.reconcile import Plan, seconds_to_opening

GROUP, VERSION, PLURAL = "flashcoupon.io", "v1alpha1", "couponevents"
FINALIZER = "flashcoupon.io/cleanup"
FORCE_DELETE = "flashcoupon.io/force-delete"
# Read when the module is imported, because kopf takes a timer's interval at registration.
REFRESH_SECONDS = env_float(os.environ, "FLASHCOUPON_OPERATOR_REFRESH_SECONDS", 5.0)
RETRY_SECONDS = 15
INFRA_ERRORS = (RedisError, RedisClusterException, SQLAlchemyError, OSError)

log = logging.getLogger(__name__)


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    # Without server/client timeouts a silently dropped watch connection hangs forever.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    # Warnings logged by handlers (a refused spec, a failed apply) become Kubernetes events.
    settings.posting.level = logging.WARNING
    settings.posting.loggers = True
    # __main__ read and checked the settings before kopf started; read them here otherwise.
    memo.redis = create_redis_cluster(memo.get("redis_settings") or RedisSettings.from_env())
    memo.engine = create_engine(memo.get("mysql_settings") or MysqlSettings.from_env(), pool_size=4)


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    await memo.redis.aclose()
    await memo.engine.dispose()


async def reconcile(
    name: str,
    spec: Mapping[str, Any],
    *,
    generation: int,
    previous: Mapping[str, Any] | None,
    memo: kopf.Memo,
) -> tuple[dict[str, Any], str | None]:
    """Apply the spec; (the full status to write, an infrastructure error or None)."""
    redis, engine = memo.redis, memo.engine
    doc = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": spec}
    plan: Plan | None = None
    error: str | None = None
    try:
        desired = parse_manifest(doc)
    except ManifestError as exc:
        plan = Plan(name, rejection=f"invalid spec: {exc}")
    else:
        try:
            plan = await runtime.apply(desired, redis=redis, engine=engine)
        except runtime.Rejected as exc:
            plan = exc.plan
        except INFRA_ERRORS as exc:
            error = f"apply failed: {exc}".splitlines()[0]
    event = None
    if error is None:
        try:
            event = await runtime.status(redis, engine, name)
        except runtime.NotFound:
            event = None  # an invalid spec that never reached the catalog
        except INFRA_ERRORS as exc:
            error = f"status failed: {exc}".splitlines()[0]
    failed = error is not None or (event is None and plan is not None and plan.rejected)
    status = cr_status(
        event=event,
        plan=plan,
        error=error,
        generation=generation,
        now=runtime.utcnow(),
        previous=previous,
    )
    if failed and error is None:
        status["phase"] = "Failed"  # refused before anything ran: nothing to show but why
    if event is not None:
        metrics.observe_event(event)
    return status, error


@kopf.on.resume(GROUP, VERSION, PLURAL, id="apply")
@kopf.on.create(GROUP, VERSION, PLURAL, id="apply")
@kopf.on.update(GROUP, VERSION, PLURAL, id="apply", field="spec")
async def apply(
    name: str,
    spec: Mapping[str, Any],
    meta: Mapping[str, Any],
    status: Mapping[str, Any],
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
    **_: Any,
) -> None:
    new, error = await reconcile(
        name, spec, generation=int(meta.get("generation", 0)), previous=status, memo=memo
    )
    patch.status.update(new)
    if error is not None:
        metrics.count("apply", "error")
        raise kopf.TemporaryError(error, delay=RETRY_SECONDS)
    accepted = next(c for c in new["conditions"] if c["type"] == "SpecAccepted")
    metrics.count("apply", "ok" if accepted["status"] == "True" else "rejected")
    if accepted["status"] == "False":
        # kopf's per-object logger turns warnings into Kubernetes events on the object.
        logger.warning("spec of %s not applied: %s", name, accepted["message"])


@kopf.timer(GROUP, VERSION, PLURAL, id="refresh", interval=REFRESH_SECONDS, initial_delay=1.0)
async def refresh(
    name: str,
    spec: Mapping[str, Any],
    meta: Mapping[str, Any],
    status: Mapping[str, Any],
    patch: kopf.Patch,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """Preload when the warm-up starts; otherwise only refresh phase and counters."""
    try:
        event = await runtime.status(memo.redis, memo.engine, name)
    except runtime.NotFound:
        return  # `apply` has not written the catalog yet (or the spec was invalid)
    except INFRA_ERRORS as exc:
        log.warning("refresh of %s failed: %s", name, exc)
        metrics.count("refresh", "error")
        return
    generation = int(meta.get("generation", 0))
    metrics.observe_event(event)  # a preload that keeps failing stays visible as Preloading
    if event.issued is None and event.phase == "Preloading":
        new, error = await reconcile(name, spec, generation=generation, previous=status, memo=memo)
        patch.status.update(new)
        metrics.count("refresh", "error" if error else "ok")
        return
    opening = seconds_to_opening(runtime.utcnow(), event.start_at, REFRESH_SECONDS)
    if opening is not None and event.phase == status.get("phase") == "Ready":
        # The doors open before the next tick, and a drop can sell out within one: wait for
        # startAt and read again so Active is written on the second. (Only once Ready is
        # written: this tick's patch is applied when the handler returns.)
        await asyncio.sleep(opening)
        try:
            event = await runtime.status(memo.redis, memo.engine, name)
        except (runtime.NotFound, *INFRA_ERRORS) as exc:
            log.warning("refresh of %s at its opening failed: %s", name, exc)
            metrics.count("refresh", "error")
            return
    metrics.count("refresh", "ok")
    # Keep the last plan's verdict (conditions, message); refresh what changes by itself.
    fresh = cr_status(
        event=event,
        plan=None,
        error=None,
        generation=generation,
        now=runtime.utcnow(),
        previous=status,
    )
    counters = ("phase", "quantity", "issued", "remaining", "persisted", "paused")
    patch.status.update({k: fresh[k] for k in counters if k in fresh})


@kopf.on.delete(GROUP, VERSION, PLURAL, id="cleanup")
async def cleanup(name: str, meta: Mapping[str, Any], memo: kopf.Memo, **_: Any) -> None:
    force = (meta.get("annotations") or {}).get(FORCE_DELETE) == "true"
    try:
        await runtime.delete(memo.redis, memo.engine, name, force=force)
    except runtime.NotPersisted as exc:
        metrics.count("cleanup", "rejected")  # waits for the pipeline: not a failure
        hint = f'(or annotate {FORCE_DELETE}="true", which loses them)'
        raise kopf.TemporaryError(f"{exc} {hint}", delay=RETRY_SECONDS) from None
    except INFRA_ERRORS as exc:
        metrics.count("cleanup", "error")
        raise kopf.TemporaryError(f"delete failed: {exc}", delay=RETRY_SECONDS) from None
    metrics.count("cleanup", "ok")
    metrics.forget_event(name)
