"""JWT verification, tickets and settings validation (no servers)."""

from __future__ import annotations

import time

import jwt
import pytest
from flashcoupon_common.http import ProblemError
from flashcoupon_common.settings import SettingsError
from flashcoupon_gateway.auth import Authenticator
from flashcoupon_gateway.settings import AuthSettings, GatewaySettings
from flashcoupon_gateway.waiting_room import parse_ticket, sign_ticket

SECRET = "unit-test-secret-0123456789-abcdefghijklmnop"
AUTH = AuthSettings(secret=SECRET, jwks_url=None, audience="flashcoupon", leeway_seconds=2)


def token(**claims: object) -> str:
    now = int(time.time())
    base = {"sub": "alice", "aud": "flashcoupon", "iat": now, "exp": now + 60}
    base.update(claims)
    return jwt.encode({k: v for k, v in base.items() if v is not None}, SECRET, algorithm="HS256")


async def auth(tok: str) -> str:
    return (await Authenticator(AUTH).authenticate(f"Bearer {tok}")).user_id


async def test_valid_token_gives_the_subject() -> None:
    assert await auth(token()) == "alice"


@pytest.mark.parametrize(
    ("claims", "detail"),
    [
        ({"exp": int(time.time()) - 30}, "expired"),
        ({"aud": "someone-else"}, "audience"),
        ({"nbf": int(time.time()) + 60}, "not valid yet"),
        ({"exp": None}, "invalid"),
        ({"aud": None}, "invalid"),
        ({"sub": "a b"}, "subject"),
        ({"sub": "{rl:x}"}, "subject"),
    ],
)
async def test_bad_claims_are_401(claims: dict[str, object], detail: str) -> None:
    with pytest.raises(ProblemError) as err:
        await auth(token(**claims))
    assert err.value.status == 401 and detail in err.value.detail
    assert "WWW-Authenticate" in err.value.headers


async def test_forged_signature_and_alg_none_are_401() -> None:
    forged = jwt.encode({"sub": "alice", "aud": "flashcoupon", "exp": time.time() + 60},
                        "another-secret-another-secret-another!", algorithm="HS256")  # fmt: skip
    unsigned = jwt.encode({"sub": "alice", "aud": "flashcoupon", "exp": time.time() + 60},
                          None, algorithm="none")  # fmt: skip
    for bad in (forged, unsigned, "not.a.jwt", token()[:-3] + "abc"):
        with pytest.raises(ProblemError) as err:
            await auth(bad)
        assert err.value.status == 401


async def test_missing_or_non_bearer_header_is_401() -> None:
    a = Authenticator(AUTH)
    for header in (None, "", "Basic abc", "Bearer "):
        with pytest.raises(ProblemError) as err:
            await a.authenticate(header)
        assert err.value.status == 401


async def test_cached_token_still_expires() -> None:
    a = Authenticator(AUTH)
    tok = token(exp=int(time.time()) + 1)
    assert (await a.authenticate(f"Bearer {tok}")).user_id == "alice"
    a._cache[tok] = type(a._cache[tok])("alice", time.time() - 10)
    with pytest.raises(ProblemError):
        await a.authenticate(f"Bearer {tok}")


def test_ticket_is_bound_to_user_event_and_expiry() -> None:
    key = b"k" * 32
    t = sign_ticket(key, "ev1", "alice", 42, 2_000)
    assert parse_ticket(key, "ev1", "alice", t, 1_000) == 42
    for event, user, ticket in [
        ("ev1", "bob", t),
        ("ev2", "alice", t),
        ("ev1", "alice", t.replace("42.", "41.", 1)),
        ("ev1", "alice", "garbage"),
    ]:
        with pytest.raises(ProblemError) as err:
            parse_ticket(key, event, user, ticket, 1_000)
        assert err.value.status == 404
    with pytest.raises(ProblemError) as err:
        parse_ticket(key, "ev1", "alice", t, 3_000)
    assert err.value.status == 410


def test_settings_refuse_placeholder_or_short_secrets() -> None:
    for bad in ("changeme", "short", "changeme-changeme-changeme-changeme", "a" * 40):
        with pytest.raises(SettingsError, match="FLASHCOUPON_GATEWAY_JWT_SECRET"):
            GatewaySettings.from_env({"FLASHCOUPON_GATEWAY_JWT_SECRET": bad})
    with pytest.raises(SettingsError, match="FLASHCOUPON_GATEWAY_JWT_SECRET"):
        GatewaySettings.from_env({})
    with pytest.raises(SettingsError, match="ISSUER_URLS"):
        GatewaySettings.from_env(
            {"FLASHCOUPON_GATEWAY_JWT_SECRET": SECRET, "FLASHCOUPON_GATEWAY_ISSUER_URLS": "ftp://x"}
        )
    s = GatewaySettings.from_env(
        {
            "FLASHCOUPON_GATEWAY_JWT_SECRET": SECRET,
            "FLASHCOUPON_GATEWAY_ISSUER_URLS": "http://a:1, http://b:2/",
        }
    )
    assert s.issuer_urls == ("http://a:1", "http://b:2")
    assert s.auth.audience == "flashcoupon"
