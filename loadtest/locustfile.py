"""A weighted Locust file for teams who run Locust against a flashcoupon gateway/ingress.

    FLASHCOUPON_EVENT=black-friday FLASHCOUPON_JWT_SECRET=... \
        locust -f loadtest/locustfile.py --host https://coupons.example.com

Self-contained on purpose (standard library + locust only), so it runs from a Locust
image without the flashcoupon workspace. Each simulated shopper has its own user id and
HS256 JWT; the weights mimic a drop: mostly pressing "get coupon" (sometimes twice, sometimes
a client retry with the same Idempotency-Key), some watching the event's public state, a few
opening their wallet. Expected answers (201, 409 DUPLICATE, 410 SOLD_OUT, 202 QUEUED, 429)
count as successes; anything else (5xx, 401, timeouts) as failures. For exact outcome
counts, latency percentiles and the invariant check, use `make demo` (docs/loadtest.md).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import os
import random
import time
import uuid

from locust import HttpUser, between, task

EVENT = os.environ.get("FLASHCOUPON_EVENT", "demo-drop")
SECRET = os.environ.get("FLASHCOUPON_JWT_SECRET", "")
AUDIENCE = os.environ.get("FLASHCOUPON_JWT_AUDIENCE", "flashcoupon")
EXPECTED_ISSUE = {201, 202, 409, 410, 429}
_ids = itertools.count()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def mint(user: str, secret: str, audience: str, ttl: int = 3600) -> str:
    """An HS256 JWT with sub=user: what the gateway verifies."""
    now = int(time.time())
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = {"sub": user, "aud": audience, "iat": now, "exp": now + ttl}
    payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
    signing_input = f"{header}.{payload}".encode()
    signature = _b64(hmac.new(secret.encode(), signing_input, hashlib.sha256).digest())
    return f"{header}.{payload}.{signature}"


class Shopper(HttpUser):
    wait_time = between(0.05, 0.5)

    def on_start(self) -> None:
        if not SECRET:
            raise RuntimeError("set FLASHCOUPON_JWT_SECRET to the gateway's HS256 secret")
        self.user_id = f"locust-{os.getpid()}-{next(_ids)}-{uuid.uuid4().hex[:6]}"
        self.auth = {"Authorization": f"Bearer {mint(self.user_id, SECRET, AUDIENCE)}"}

    def _issue(self, key: str, name: str) -> None:
        headers = {**self.auth, "Idempotency-Key": key}
        with self.client.post(
            f"/v1/events/{EVENT}/issue", headers=headers, name=name, catch_response=True
        ) as r:
            if r.status_code in EXPECTED_ISSUE:
                r.success()
            else:
                r.failure(f"unexpected {r.status_code}: {r.text[:200]}")

    @task(10)
    def press(self) -> None:
        key = uuid.uuid4().hex
        self._issue(key, "issue")
        if random.random() < 0.05:  # a client that timed out re-sends the same request
            self._issue(key, "issue (retry, same key)")

    @task(2)
    def press_again(self) -> None:
        self._issue(uuid.uuid4().hex, "issue (another press)")

    @task(3)
    def event_state(self) -> None:
        self.client.get(f"/v1/events/{EVENT}", name="event state")

    @task(1)
    def wallet(self) -> None:
        self.client.get("/v1/me/coupons", headers=self.auth, name="my coupons")
