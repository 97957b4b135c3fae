"""Start-up cost of reading each service's settings with the generic reader (printed only).

`python -m flashcoupon_loadtest.bench_settings` needs no server. Per service it prints the
first read in this process (which resolves the dataclass's type hints, cached afterwards),
the warm read, and — the baseline in the same run — building the same dataclass from values
already converted, the floor any reader costs. Settings are read once per process, so the
first read is the figure that matters; it is compared with the process's import time.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from flashcoupon_common.settings import FromEnv

WARM_READS = 2000
ENV = {"FLASHCOUPON_ENV": "local", "FLASHCOUPON_GATEWAY_JWT_SECRET": "0123456789abcdef" * 2}


def _rebuild(settings: Any) -> Any:
    """The same object again from its field values (nested settings already built)."""
    values = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings) if f.init}
    return type(settings)(**values)


def main() -> None:
    started = time.perf_counter()
    from flashcoupon_gateway.settings import GatewaySettings
    from flashcoupon_issuer.settings import IssuerSettings
    from flashcoupon_persister.settings import PersisterSettings
    from flashcoupon_relay.settings import RelaySettings
    from flashcoupon_wallet.settings import WalletSettings

    imported = time.perf_counter() - started
    classes: list[type[FromEnv]] = [
        GatewaySettings,
        IssuerSettings,
        RelaySettings,
        PersisterSettings,
        WalletSettings,
    ]
    print(f"importing the five settings modules: {imported * 1e3:.0f} ms")
    print(f"{'settings':<18} {'first read':>11} {'warm read':>10} {'construct':>10} {'ratio':>6}")
    for cls in classes:
        t0 = time.perf_counter()
        settings = cls.from_env(ENV)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(WARM_READS):
            cls.from_env(ENV)
        warm = (time.perf_counter() - t0) / WARM_READS
        t0 = time.perf_counter()
        for _ in range(WARM_READS):
            _rebuild(settings)
        floor = (time.perf_counter() - t0) / WARM_READS
        print(
            f"{cls.__name__:<18} {first * 1e6:>8.0f} us {warm * 1e6:>7.1f} us "
            f"{floor * 1e6:>7.1f} us {warm / floor:>5.1f}x"
        )


if __name__ == "__main__":
    main()
