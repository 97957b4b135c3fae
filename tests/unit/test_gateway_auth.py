"""JWT verification, tickets and settings validation (no servers)."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

import jwt
import pytest
from flashcoupon_common.http import ProblemError
from flashcoupon_common.settings import SettingsError
from flashcoupon_gateway import auth as auth_module
from flashcoupon_gateway.auth import Authenticator
from flashcoupon_gateway.settings import AuthSettings, GatewaySettings
from flashcoupon_gateway.waiting_room import parse_ticket, sign_ticket

from tests.support.env import LOCAL

SECRET = "unit-test-secret-0123456789-abcdefghijklmnop"
AUTH = AuthSettings(secret=SECRET, jwks_url=None, audience="flashcoupon", leeway_seconds=2)


def token(**claims: object) -> str:
    now = int(time.time())
    base = {"sub": "alice", "aud": "flashcoupon", "iat": now, "exp": now + 60}
    base.update(claims)
    return jwt.encode({k: v for k, v in base.items() if v is not None}, SECRET, algorithm="HS256")


@dataclass(frozen=True)
class FromNow:
    """A claim's time, `seconds` from when the test runs."""

    seconds: int


async def auth(tok: str) -> str:
    return (await Authenticator(AUTH).authenticate(f"Bearer {tok}")).user_id


async def test_valid_token_gives_the_subject() -> None:
    assert await auth(token()) == "alice"


@pytest.mark.parametrize(
    ("claims", "detail"),
    [
        ({"exp": FromNow(-30)}, "expired"),
        ({"aud": "someone-else"}, "audience"),
        ({"nbf": FromNow(60)}, "not valid yet"),
        ({"exp": None}, "invalid"),
        ({"aud": None}, "invalid"),
        ({"sub": "a b"}, "subject"),
        ({"sub": "{rl:x}"}, "subject"),
    ],
)
async def test_bad_claims_are_401(claims: dict[str, object], detail: str) -> None:
    now = int(time.time())  # now, not at collection: a long run must not make nbf pass
    claims = {k: now + v.seconds if isinstance(v, FromNow) else v for k, v in claims.items()}
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
    a._cache[tok] = ("alice", time.time() - 10)
    with pytest.raises(ProblemError):
        await a.authenticate(f"Bearer {tok}")


def test_the_token_cache_adds_nothing_the_garbage_collector_walks() -> None:
    # A crowd fills the cache with one entry per shopper (~90k in a gateway during make demo).
    # Entries the collector tracks are walked by every full collection: as Principal objects
    # they made a loaded gateway's full collections take 20-60 ms (issue 13).
    a = Authenticator(AUTH)
    headers = [f"Bearer {token(sub=f'shopper-{i}')}" for i in range(2000)]
    gc.collect()
    before = len(gc.get_objects())
    users = {a.authenticate_now(h).user_id for h in headers}  # type: ignore[union-attr]
    assert len(users) == 2000
    del users
    gc.collect()
    assert len(gc.get_objects()) - before < 100


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
            GatewaySettings.from_env({**LOCAL, "FLASHCOUPON_GATEWAY_JWT_SECRET": bad})
    with pytest.raises(SettingsError, match="FLASHCOUPON_GATEWAY_JWT_SECRET"):
        GatewaySettings.from_env(LOCAL)
    with pytest.raises(SettingsError, match="ISSUER_URLS"):
        GatewaySettings.from_env(
            {
                **LOCAL,
                "FLASHCOUPON_GATEWAY_JWT_SECRET": SECRET,
                "FLASHCOUPON_GATEWAY_ISSUER_URLS": "ftp://x",
            }
        )
    s = GatewaySettings.from_env(
        {
            **LOCAL,
            "FLASHCOUPON_GATEWAY_JWT_SECRET": SECRET,
            "FLASHCOUPON_GATEWAY_ISSUER_URLS": "http://a:1, http://b:2/",
        }
    )
    assert s.issuer_urls == ("http://a:1", "http://b:2")
    assert s.auth.audience == "flashcoupon"


def _parity_cases() -> list[str]:
    now = int(time.time())
    good = {"sub": "alice", "aud": "flashcoupon", "iat": now, "exp": now + 60}
    cases = [
        jwt.encode(good, SECRET, algorithm="HS256"),
        jwt.encode({**good, "aud": ["x", "flashcoupon"]}, SECRET, algorithm="HS256"),
        jwt.encode({**good, "exp": now - 1}, SECRET, algorithm="HS256"),  # within leeway
        jwt.encode({**good, "exp": now - 30}, SECRET, algorithm="HS256"),
        jwt.encode({**good, "nbf": now + 30}, SECRET, algorithm="HS256"),
        jwt.encode({**good, "iat": now + 30}, SECRET, algorithm="HS256"),
        jwt.encode({**good, "aud": "other"}, SECRET, algorithm="HS256"),
        jwt.encode({**good, "exp": "soon"}, SECRET, algorithm="HS256"),
        jwt.encode(good, SECRET, algorithm="HS512"),
        jwt.encode(good, SECRET + "x", algorithm="HS256"),
        jwt.encode(good, None, algorithm="none"),
    ]
    h, p, s = cases[0].split(".")
    cases += [f"{h}.{p}.{s[:-2]}AA", f"{h}.{p}x.{s}", f"{h}.{p}", "a.b.c", f"{h}.{p}.{s}=="]
    # The same signature bytes spelled otherwise: a 32-byte HMAC takes 43 base64url
    # characters, and the last one's two low bits are padding (zero as libraries write it).
    last = _B64URL.index(s[-1])
    cases += [f"{h}.{p}.{s[:-1]}{_B64URL[last | 1]}", f"{h}.{p}.{s[:-1]}{_B64URL[last | 3]}"]
    return cases


_B64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


@pytest.mark.filterwarnings("ignore:The HMAC key is")  # _parity_cases' HS512 token
def test_hs256_without_openssl_hmac_verifies_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a Python without OpenSSL's HMAC object the signer is hmac.HMAC, with the same
    verdicts."""
    key = SECRET.encode()
    fast = auth_module.hs256_signer(key)
    monkeypatch.setattr(auth_module, "_openssl_hmac", None)
    plain = auth_module.hs256_signer(key)
    assert type(plain) is not type(fast)
    for tok in _parity_cases():
        verdicts = []
        for signer in (fast, plain):
            try:
                claims = auth_module.verify_hs256(
                    tok, signer, audience="flashcoupon", leeway=2, now=time.time()
                )
                verdicts.append(claims["sub"])
            except ProblemError as exc:
                verdicts.append(exc.detail)
        assert verdicts[0] == verdicts[1], tok
    assert (
        auth_module.verify_hs256(token(), plain, audience="flashcoupon", leeway=2, now=time.time())[
            "sub"
        ]
        == "alice"
    )


@pytest.mark.filterwarnings("ignore:The HMAC key is")  # the HS512 case: refused anyway
async def test_fast_hs256_path_agrees_with_pyjwt() -> None:
    for tok in _parity_cases():
        try:
            claims = jwt.decode(tok, SECRET, algorithms=["HS256"], audience="flashcoupon",
                                leeway=2, options={"require": ["exp", "sub", "aud"]})  # fmt: skip
            expected = claims["sub"]
        except jwt.InvalidTokenError:
            expected = None
        try:
            got = await auth(tok)
        except ProblemError as exc:
            assert exc.status == 401
            got = None
        assert got == expected, tok


async def test_jwks_rs256_with_key_rotation() -> None:
    import httpx
    from cryptography.hazmat.primitives.asymmetric import rsa
    from flashcoupon_gateway.auth import JWKSCache

    keys = {kid: rsa.generate_private_key(public_exponent=65537, key_size=2048) for kid in "ab"}
    served = ["a"]

    def jwks(request: httpx.Request) -> httpx.Response:
        out = []
        for kid in served:
            jwk = jwt.algorithms.RSAAlgorithm.to_jwk(keys[kid].public_key(), as_dict=True)
            out.append({**jwk, "kid": kid, "alg": "RS256", "use": "sig"})
        return httpx.Response(200, json={"keys": out})

    http = httpx.AsyncClient(transport=httpx.MockTransport(jwks))
    settings = AuthSettings(secret=None, jwks_url="http://idp/jwks", audience="flashcoupon")
    a = Authenticator(settings, jwks=JWKSCache(settings.jwks_url, 300, http))
    claims = {"sub": "carol", "aud": "flashcoupon", "exp": int(time.time()) + 60}
    tok_a = jwt.encode(claims, keys["a"], algorithm="RS256", headers={"kid": "a"})
    assert (await a.authenticate(f"Bearer {tok_a}")).user_id == "carol"
    # HS256 signed with the public key's bytes (the classic confusion attack) is refused.
    hs = jwt.encode(claims, "x" * 40, algorithm="HS256", headers={"kid": "a"})
    with pytest.raises(ProblemError):
        await a.authenticate(f"Bearer {hs}")
    # Unknown kid right after a fetch: refused without hammering the IdP.
    tok_b = jwt.encode(
        {**claims, "sub": "dave"}, keys["b"], algorithm="RS256", headers={"kid": "b"}
    )
    served.append("b")
    with pytest.raises(ProblemError):
        await a.authenticate(f"Bearer {tok_b}")
    a.jwks._fetched_at -= 60  # later: an unknown kid triggers a refetch and is then accepted
    assert (await a.authenticate(f"Bearer {tok_b}")).user_id == "dave"
    await http.aclose()
