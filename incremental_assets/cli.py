"""The ``incremental-assets`` command."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="incremental-assets")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="simulate sources and load them through Dagster")
    demo.add_argument("--rounds", type=int, default=4, help="simulated days (default 4)")
    demo.add_argument(
        "--postgres",
        action="store_true",
        help="keep the orders table in PostgreSQL and load it over JDBC: starts a throwaway "
        "server (needs PostgreSQL and libpostgresql-jdbc-java installed), or uses the one "
        "INCREMENTAL_ASSETS_DEMO_PG_URL=postgresql://user@host:port/db names (password in "
        "DEMO_SHOP_PASSWORD)",
    )
    args = parser.parse_args(argv)
    if args.command == "demo":
        from incremental_assets.demo.run import main as demo_main
        from incremental_assets.demo.shop_database import DemoDatabaseUnavailable

        try:
            return demo_main(rounds=args.rounds, postgres=args.postgres)
        except DemoDatabaseUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
