"""Helpers every test tier shares; test modules import from here, never from each other.

env          environments for settings built in tests (FLASHCOUPON_ENV=local)
names        random names per test;  paths  repository root, console scripts
stack        the local stack's settings and a service environment for it
ports        free TCP ports;  polling  wait_until a condition (no fixed sleeps)
asgi         apps in-process: LifespanManager + httpx.ASGITransport
processes    services as processes (on flashcoupon_loadtest.localrun)
metrics      Prometheus samples: in-process registry or scraped /metrics text
private_stack  private Redis/Kafka/MariaDB instances for failure drills
issuer, relay, persister, wallet, gateway, manifest, reconcile, deploy
             per-component fixtures data and helpers
"""
