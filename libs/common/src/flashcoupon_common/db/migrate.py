"""`flashcoupon-migrate [upgrade|downgrade REV|current]`: run the schema migrations (Alembic).

The database URL comes from FLASHCOUPON_MYSQL_URL, as for every service.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from alembic import command
from alembic.config import Config

from flashcoupon_common.settings import MysqlSettings

MIGRATIONS = Path(__file__).with_name("migrations")


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    # Alembic's config is ConfigParser-based: a literal % in a password must be doubled.
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="flashcoupon-migrate", description=__doc__)
    sub = parser.add_subparsers(dest="cmd")
    sub.add_parser("upgrade", help="upgrade to the newest revision (default)")
    down = sub.add_parser("downgrade", help="downgrade to REV")
    down.add_argument("revision")
    sub.add_parser("current", help="print the current revision")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cfg = alembic_config(MysqlSettings.from_env().url)
    if args.cmd == "downgrade":
        command.downgrade(cfg, args.revision)
    elif args.cmd == "current":
        command.current(cfg)
    else:
        command.upgrade(cfg, "head")


if __name__ == "__main__":
    main()
