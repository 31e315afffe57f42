"""The ``incremental-assets`` command."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="incremental-assets")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="simulate sources and load them through Dagster")
    demo.add_argument("--rounds", type=int, default=4, help="simulated days (default 4)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from incremental_assets.demo.run import main as demo_main

        return demo_main(rounds=args.rounds)
    return 2


if __name__ == "__main__":
    sys.exit(main())
