"""The ``incremental-assets`` command: the demo, and day-2 operations on the tables of a
tables file (status, rewind, explain, replay-quarantine, reconcile), read from and written to
the Delta log."""

from __future__ import annotations

import argparse
import difflib
import getpass
import json
import os
import sys
from pathlib import Path

from incremental_assets.terminal import printable

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class CliError(Exception):
    """A refused command; the message says what to change."""


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "demo":
        from incremental_assets.demo.run import DemoTablesError
        from incremental_assets.demo.run import main as demo_main
        from incremental_assets.demo.s3_server import S3Unavailable
        from incremental_assets.demo.shop_database import DemoDatabaseUnavailable
        from incremental_assets.specs import SpecError

        try:
            if args.storage_option and not args.warehouse:
                raise CliError("--storage-option goes with --warehouse URI (its options)")
            return demo_main(
                rounds=args.rounds,
                postgres=args.postgres,
                warehouse=args.warehouse,
                storage_options=_storage_options(args.storage_option),
                s3=args.s3,
                only=_demo_only(args.only),
                **({"root": Path(args.root).resolve()} if args.root else {}),
            )
        except (
            DemoDatabaseUnavailable,
            DemoTablesError,
            S3Unavailable,
            SpecError,
            CliError,
        ) as exc:
            print(f"error: {printable(str(exc), lines=True)}", file=sys.stderr)
            return 2
    from incremental_assets.engine.errors import IncrementalLoadError, SparkRemoteError
    from incremental_assets.specs import SpecError

    commands = {
        "status": _status,
        "rewind": _rewind,
        "explain": _explain,
        "replay-quarantine": _replay_quarantine,
        "reconcile": _reconcile,
        "free-slots": _free_slots,
        "reset-layer": _reset_layer,
    }
    try:
        code = commands[args.command](args)
        sys.stdout.flush()
        return code
    except (CliError, IncrementalLoadError, SpecError, SparkRemoteError) as exc:
        print(f"error: {printable(str(exc), lines=True)}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): send the rest of the output nowhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _storage_options(pairs: list[str]) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise CliError(f"--storage-option {pair!r}: write KEY=VALUE, e.g. region=eu-west-1")
        options[key.strip()] = value
    return options


def _demo_only(text: str | None) -> list[str]:
    """``--only``'s table names (none given: every table)."""
    if text is None:
        return []
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise CliError("--only needs table names, e.g. --only orders,events")
    return names


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="incremental-assets")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="simulate sources and load them through Dagster")
    demo.add_argument(
        "--rounds", type=int, default=4, help="simulated days (default 4; with 1, no backfill)"
    )
    demo.add_argument(
        "--postgres",
        action="store_true",
        help="keep the orders table in PostgreSQL and load it over JDBC: starts a throwaway "
        "server (needs PostgreSQL and libpostgresql-jdbc-java installed), or uses the one "
        "INCREMENTAL_ASSETS_DEMO_PG_URL=postgresql://user@host:port/db names (password in "
        "DEMO_SHOP_PASSWORD)",
    )
    where = demo.add_mutually_exclusive_group()
    where.add_argument(
        "--s3",
        action="store_true",
        help="put the warehouse (every target, its side tables, staging and checkpoints) in "
        "a bucket of a throwaway local S3 server (moto's, from the dev extra); the sources "
        "stay in data/source",
    )
    where.add_argument(
        "--warehouse",
        metavar="URI",
        help="put the warehouse under URI instead of tables.yaml's warehouse.root: a folder, "
        "s3://BUCKET/PREFIX or abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/PREFIX; "
        "credentials from the standard environment variables (AWS_ACCESS_KEY_ID, ...)",
    )
    demo.add_argument(
        "--storage-option",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="with --warehouse, one of its storage options (as warehouse.storage_options in "
        "tables.yaml, e.g. region=eu-west-1 or endpoint=http://127.0.0.1:9000); repeatable",
    )
    demo.add_argument(
        "--only",
        metavar="NAME[,NAME...]",
        help="run the demo for these tables only (a landing table with its layers), e.g. "
        "--only orders; data/ and the Dagster instance are reset all the same; default: "
        "every table",
    )
    demo.add_argument(
        "--root",
        metavar="DIR",
        help="run the demo in DIR (its tables.yaml and dagster.yaml; the demo's data/ and "
        "Dagster instance are reset there) instead of the project's folder. On a cluster DIR "
        "must be on storage every executor reads (the simulated sources are written there)",
    )
    tables = {
        "metavar": "FILE",
        "help": "the tables file (default: INCREMENTAL_ASSETS_TABLES, else the project's "
        "tables.yaml)",
    }

    status = commands.add_parser(
        "status",
        help="every table's watermark, lag, last run, row counts and Delta version, read "
        "from the Delta log (no Spark)",
    )
    status.add_argument("--tables", **tables)
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")

    rewind = commands.add_parser(
        "rewind",
        help="move a table's watermark back (or reset it) so the next run re-extracts from "
        "there, or accept the source the spec names now; recorded in the Delta history with "
        "who and why",
    )
    rewind.add_argument("table")
    to = rewind.add_mutually_exclusive_group()
    to.add_argument(
        "--to",
        metavar="VALUE",
        help="the new watermark: an ISO-8601 time for timestamp watermarks (no zone: UTC), "
        "an integer for id and sequence watermarks, TIME|ID for hybrid ones; a value the "
        "next run cannot read from (past the lookback's reach of the first or last instant "
        "or 64-bit integer) is refused",
    )
    to.add_argument(
        "--reset",
        action="store_true",
        help="no watermark: reload from partitioning.start (from the source the spec names now)",
    )
    rewind.add_argument(
        "--accept-source",
        action="store_true",
        help="the spec names another source than the table was loaded from (a new database, "
        "table, folder or Delta path): accept it; alone, the watermark is kept and the next "
        "run goes on from it (also for snapshot and landing tables); with --to, from there",
    )
    rewind.add_argument("--reason", required=True, help="why, kept in the Delta history")
    rewind.add_argument("--by", help="who asks (default: the OS user)")
    rewind.add_argument("--tables", **tables)

    explain = commands.add_parser(
        "explain",
        help="plan a run without writing: window, source predicate, rows, target files",
    )
    explain.add_argument("table")
    explain.add_argument(
        "--partition",
        help="a partition key (2026-01-02, hourly 2026-01-02-05:00) or a range FIRST...LAST "
        "(a backfill); default: the latest partition",
    )
    explain.add_argument("--tables", **tables)
    explain.add_argument("--json", action="store_true", help="print JSON instead of text")

    replay = commands.add_parser(
        "replay-quarantine",
        help="merge the quarantined rows that pass the table's quality rules now into the "
        "target (exactly once) and release them; the watermark stays",
    )
    replay.add_argument("table")
    replay.add_argument("--tables", **tables)

    reconcile = commands.add_parser(
        "reconcile",
        help="compare source and target row counts per partition and list the partitions "
        "that differ (exit status 1 when a backfill could repair one); --backfill re-loads "
        "just those",
        description="For each partition in FIRST..LAST, count the rows the target should hold "
        "(the source's newest version of each key up to the watermark, without quarantined "
        "rows) and the rows it holds, by the partition column: one Spark aggregation per "
        "side. For an upsert or append table, target rows whose key the source no longer "
        "holds (deleted there) are counted apart: no backfill removes them, so they are "
        "reported with the strategy that would capture them and do not fail the command "
        "unless --strict is given. Exit status 1 when a partition differs in a way a "
        "backfill repairs (or, with --strict, in any way), 0 otherwise.",
    )
    reconcile.add_argument("table")
    reconcile.add_argument(
        "--from", dest="first", required=True, metavar="FIRST", help="first partition key"
    )
    reconcile.add_argument(
        "--to", dest="last", metavar="LAST", help="last partition key (default: the latest)"
    )
    reconcile.add_argument("--json", action="store_true", help="print JSON instead of a table")
    reconcile.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 on any difference, also rows gone from the source that no backfill removes",
    )
    reconcile.add_argument(
        "--backfill",
        action="store_true",
        help="then materialize the partitions a backfill repairs through Dagster, in this "
        "process, on the instance in DAGSTER_HOME (no daemon needed): one run per run of adjacent "
        "partitions, each tagged as a backfill so it re-reads whole partition windows; then "
        "reconcile again (the exit status reflects the result)",
    )
    reconcile.add_argument("--tables", **tables)

    free_slots = commands.add_parser(
        "free-slots",
        help="mark a run that died holding, handed or queued for a table's pool slot as "
        "failed and remove it from the pools (on the instance in DAGSTER_HOME), so the "
        "table's next run can proceed",
        description="A run killed inside its step or while waiting for its slot (SIGKILL, "
        "out of memory, a lost machine) stays in its pool's books: holding the slot, handed "
        "it, or queued for it. The project's runs remove such a run themselves when its "
        "worker was on this host; this command does it for a run whose worker was "
        "elsewhere, and says how many slots and queue places it freed. It refuses a run "
        "whose worker still runs on this host.",
    )
    free_slots.add_argument("run_id", help="the run named by the waiting run's warning")

    reset_layer = commands.add_parser(
        "reset-layer",
        help="empty a streaming layer's Delta table and its checkpoint, so its "
        "next materialization reads every file of its source folder anew",
        description="A streaming layer (run: streaming) keeps its Delta table and its "
        "query's checkpoint (<layer folder>__checkpoint) together; after a change of its "
        "declaration or source, or after one of the two was deleted, its runs refuse to start. "
        "This "
        "empties both (the checkpoint first); the next materialization creates both again.",
    )
    reset_layer.add_argument("layer")
    reset_layer.add_argument("--tables", **tables)
    return parser


# -- reset-layer ------------------------------------------------------------------------------


def _reset_layer(args: argparse.Namespace) -> int:
    from incremental_assets.engine.delta_lake.store import DeltaTarget
    from incremental_assets.engine.streaming.checkpoint import checkpoint_location, reset

    project = _project(args.tables)
    try:
        layer = project.layer(args.layer)
    except KeyError as exc:
        raise CliError(str(exc.args[0])) from None
    if not layer.streaming:
        raise CliError(
            f"layer '{layer.name}' runs in batch and has no checkpoint; a batch layer's own "
            "commits record what it covers"
        )
    target = DeltaTarget(layer.name, project.layer_path(layer), project.warehouse.storage_options)
    reset(_spark(project, "incremental-assets-reset-layer"), target)
    print(
        f"{layer.name}: emptied its checkpoint {checkpoint_location(target)} and its Delta "
        f"table {target.path}; the next materialization reads every file anew"
    )
    return 0


# -- free-slots -----------------------------------------------------------------------------


def _free_slots(args: argparse.Namespace) -> int:
    import dagster as dg

    from incremental_assets.dagster_layer.pools import free
    from incremental_assets.dagster_layer.workers import WORKER_TAG
    from incremental_assets.engine.processes import process_alive

    _instance_home("free-slots")
    with dg.DagsterInstance.get() as instance:
        run = instance.get_run_by_id(args.run_id)
        if run is None and not _holds_slots(instance, args.run_id):
            raise CliError(f"no run {args.run_id} on the instance in {os.environ['DAGSTER_HOME']}")
        tag = run.tags.get(WORKER_TAG) if run is not None else None
        if process_alive(tag):
            raise CliError(
                f"run {args.run_id}'s worker {tag} is still running on this host; stop it "
                "(or wait for it) instead of freeing its slots"
            )
        freed = free(instance, args.run_id, f"Marked failed by {_os_user()} (free-slots).")
    status = "marked failed" if freed.marked_failed else "had already ended"
    print(printable(f"run {args.run_id}: {status}; {freed.describe()}"))
    return 0


def _holds_slots(instance, run_id: str) -> bool:
    """Whether ``run_id`` is in a pool's books (Dagster lists a run with a claimed slot
    among its queued steps too)."""
    return run_id in instance.event_log_storage.get_concurrency_run_ids()


# -- reconcile ----------------------------------------------------------------------------


def _reconcile(args: argparse.Namespace) -> int:
    from incremental_assets.engine.reconcile import reconcile, refuse_unless_windows

    project = _project(args.tables)
    spec = _table(project, args.table)
    refuse_unless_windows(spec)
    if args.backfill:
        _instance_home()
    start, end, keys = _partition_range(spec, args.first, args.last)
    target = _target(project, spec)
    spark = _spark(project, "incremental-assets-reconcile")
    report = reconcile(spark, spec, target, start, end)
    if not (args.backfill and report.repairable):
        _print_reconciliation(report, args.json)
        if args.backfill and not args.json:
            print("no partition a backfill can repair: nothing re-loaded")
        return _reconcile_status(report, args.strict)
    if not args.json:
        _print_reconciliation(report, False)
    runs = _backfill(project, spec, [p.partition for p in report.repairable], keys)
    after = reconcile(spark, spec, target, start, end)
    if args.json:
        # One document: the reconciliation after the backfill, the one before and the runs.
        backfill = [
            {"first": first, "last": last, "run_id": run_id, "success": ok}
            for first, last, run_id, ok in runs
        ]
        before = report.to_json()
        print(json.dumps({**after.to_json(), "before": before, "backfill": backfill}, indent=2))
    else:
        for first, last, run_id, ok in runs:
            span = first if first == last else f"{first}...{last}"
            print(f"backfill {span}: run {run_id} {'succeeded' if ok else 'FAILED'}")
        print("after the backfill:")
        _print_reconciliation(after, False)
    return max(_reconcile_status(after, args.strict), 0 if all(ok for *_, ok in runs) else 1)


def _reconcile_status(report, strict: bool) -> int:
    """1 when a backfill would repair a partition, or with ``strict`` any difference."""
    return 1 if report.repairable or (strict and report.differing) else 0


def _print_reconciliation(report, as_json: bool) -> None:
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
        return
    first, last = report.partitions[0].partition, report.partitions[-1].partition
    print(
        f"{report.table}: partitions {first}...{last} by {report.column} "
        f"(source rows up to the watermark {report.cursor})"
    )
    gone = bool(report.unrepairable)
    header = ("partition", "source rows", "target rows", "difference")
    header += ("gone from source",) if gone else ()
    rows = []
    for p in report.partitions:
        row = (p.partition, p.source_rows, p.target_rows, _signed(p.difference))
        rows.append(row + ((p.gone_from_source,) if gone else ()))
    print(_aligned([header, *rows]))
    repairable = [p.partition for p in report.repairable]
    if repairable:
        plural = "s differ (a backfill repairs them)"
        if len(repairable) == 1:
            plural = " differs (a backfill repairs it)"
        print(f"{len(repairable)} partition{plural}: {', '.join(repairable)}")
    elif not report.differing:
        print("no partition differs")
    else:
        print("no partition differs in a way a backfill repairs")
    note = report.unrepairable_note()
    if note:
        print(f"not repairable: {note} (not an error; --strict makes it one)")


def _signed(number: int) -> str:
    return f"{number:+d}" if number else "0"


def _partition_range(spec, first: str, last: str | None):
    """[start, end) of partitions FIRST..LAST, and every key of the table's partitions."""
    from incremental_assets.dagster_layer.partitions import partitions_for

    partitions = partitions_for(spec)
    last = last or partitions.get_last_partition_key()
    for key in (first, last):
        if key is None or not partitions.has_partition_key(key):
            example = partitions.get_last_partition_key() or "-"
            raise CliError(
                f"'{key}' is not a partition of table '{spec.name}' "
                f"({spec.partitioning.granularity} partitions from "
                f"{partitions.get_first_partition_key()} to {example})"
            )
    start = partitions.time_window_for_partition_key(first).start
    end = partitions.time_window_for_partition_key(last).end
    if end <= start:
        raise CliError(f"--from {first} is after --to {last}; write them in order")
    return start, end, partitions.get_partition_keys()


def _instance_home(what: str = "--backfill") -> None:
    if not os.environ.get("DAGSTER_HOME"):
        raise CliError(
            f"{what} works on the Dagster instance in DAGSTER_HOME, which is not set; set it "
            "to the instance's folder (./dev sets it to the project root)"
        )


def _backfill(project, spec, differing: list[str], keys: list[str]):
    """Materialize the differing partitions in this process, one run per stretch of
    adjacent partitions; returns (first, last, run id, success) per run."""
    import dagster as dg

    from incremental_assets.dagster_layer.assets import pool_name
    from incremental_assets.dagster_layer.build import build_definitions
    from incremental_assets.dagster_layer.partitions import RELOAD_TAG
    from incremental_assets.dagster_layer.pools import wait_for_pools

    _instance_home()
    defs = build_definitions(project)
    asset = defs.get_assets_def(spec.name)
    position = {key: i for i, key in enumerate(keys)}
    stretches: list[list[str]] = []
    for key in sorted(differing, key=position.__getitem__):
        if stretches and position[key] == position[stretches[-1][-1]] + 1:
            stretches[-1].append(key)
        else:
            stretches.append([key])
    runs = []
    instance = dg.DagsterInstance.get()
    for stretch in stretches:
        first, last = stretch[0], stretch[-1]
        # dg.materialize runs Dagster's plain in-process executor: free a dead run's slot
        # of this table's pool first, as the project's executor does.
        wait_for_pools(instance, [pool_name(spec)], lambda text: print(text, file=sys.stderr))
        result = dg.materialize(
            [asset],
            instance=instance,
            resources=defs.resources,
            tags={
                # Re-read whole partition windows, even the cursor's own, as a backfill does.
                RELOAD_TAG: "true",
                "dagster/asset_partition_range_start": first,
                "dagster/asset_partition_range_end": last,
                "incremental_assets/reconcile": "true",
            },
            raise_on_error=False,
        )
        runs.append((first, last, result.run_id, result.success))
    return runs


# -- replay-quarantine ----------------------------------------------------------------------


def _replay_quarantine(args: argparse.Namespace) -> int:
    from incremental_assets.engine.load import merge_plan_of
    from incremental_assets.engine.quarantine import replay

    project = _project(args.tables)
    spec = _table(project, args.table)
    if not spec.quality.rules:
        raise CliError(f"table '{spec.name}' has no quality rules, so nothing is quarantined")
    spark = _spark(project, "incremental-assets-replay")
    result = replay(spark, spec, _target(project, spec), merge_plan_of(spec))
    written = (
        f"Delta version {_text(result.delta_version)}" if result.committed else "nothing committed"
    )
    print(
        f"{spec.name}: {result.examined} quarantined rows examined, {result.replayed} pass "
        f"the rules now and were merged ({result.rows_inserted} inserted, "
        f"{result.rows_updated} updated; {written}), "
        f"{result.still_failing} still fail and stay in the quarantine"
    )
    return 0


# -- status -------------------------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    from incremental_assets.engine.operations import table_status

    project = _project(args.tables)
    statuses = [table_status(spec, _target(project, spec)) for spec in project.tables]
    # A table whose log cannot be read is reported as such; the others are still listed,
    # and the exit status is 1.
    failed = 1 if any(s.error for s in statuses) else 0
    if args.json:
        print(json.dumps([s.to_json() for s in statuses], indent=2))
        return failed
    header = (
        "table",
        "watermark",
        "lag",
        "last run",
        "run",
        "partition",
        "mode",
        "extracted",
        "inserted",
        "updated",
        "deleted",
        "version",
        "rows",
        "files",
    )
    rows, notes = [], []
    for s in statuses:
        rows.append(_status_row(s, len(header)))
        if s.error:
            notes.append(f"* {s.table}: unreadable: {printable(s.error)}")
        if s.rewind is not None:
            notes.append(f"* {s.table}: {_rewind_note(s.rewind)}")
    print(_aligned([header, *rows]))
    for note in notes:
        print(note)
    return failed


def _rewind_note(r) -> str:
    """A rewind newer than the last run, one line: who and why are typed text, escaped."""
    if r.operation == "accept-source":
        what = f"source {printable(str(r.source))} accepted"
        if r.source_before:
            what += f" (was {printable(r.source_before)})"
        starts = "the next run reads it"
    else:
        what = (
            f"reset (was {r.cursor_before})"
            if r.cursor_after == "-"
            else f"rewound from {r.cursor_before} to {r.cursor_after}"
        )
        starts = "the next run starts there"
    return f"{what} at {_text(r.time)} by {printable(r.by)}: {printable(r.reason)}; {starts}"


def _status_row(s, columns: int) -> tuple[str, ...]:
    if s.error:
        return (s.table, "(unreadable)", *["-"] * (columns - 2))
    if not s.loaded:
        return (s.table, "(not loaded yet)", *["-"] * (columns - 2))
    run = s.last_run
    ran = (
        (
            _text(run.time),
            run.run_id[:8],
            run.partition or "-",
            run.mode,
            *map(_text, (run.rows_extracted, run.rows_inserted, run.rows_updated)),
            _text(run.rows_deleted),
        )
        if run
        else ("-",) * 8
    )
    watermark = _text(s.cursor)
    if s.cursor is None:
        watermark = "(by file)" if s.watermark_kind == "landing" else "(reset)"
    watermark += " *" if s.rewind is not None else ""
    counts = (_text(s.delta_version), _text(s.rows), _text(s.files))
    return (s.table, watermark, _duration(s.lag_seconds), *ran, *counts)


# -- rewind -------------------------------------------------------------------------------


def _rewind(args: argparse.Namespace) -> int:
    from incremental_assets.engine.operations import accept_source, rewind

    if args.to is None and not args.reset and not args.accept_source:
        raise CliError(
            f"rewind {args.table}: say what to do: --to VALUE (move the watermark back), "
            "--reset (reload from partitioning.start) or --accept-source (accept the source "
            "the spec names now)"
        )
    project = _project(args.tables)
    spec = _table(project, args.table)
    who = {"by": args.by or _os_user(), "reason": args.reason}
    spark = _spark(project, "incremental-assets-rewind")
    target = _target(project, spec)
    if args.accept_source and args.to is None and not args.reset:
        result = accept_source(spec, target, spark=spark, **who)
        print(
            f"{result.table}: source {printable(result.source)} accepted (was "
            f"{printable(result.source_before or '-')}) in Delta version {result.version}, "
            f"by {printable(result.by)}: {printable(result.reason)}; watermark kept at "
            f"{_text(result.cursor_after)}"
        )
    else:
        to = None if args.reset else args.to
        result = rewind(spec, target, to, spark=spark, accept_source=args.accept_source, **who)
        action = "reset" if result.cursor_after is None else "rewound"
        print(
            f"{result.table}: watermark {action} {_text(result.cursor_before)} -> "
            f"{_text(result.cursor_after)} in Delta version {result.version}, by "
            f"{printable(result.by)}: {printable(result.reason)}"
        )
        if result.source_before:
            print(
                f"Source {printable(result.source)} accepted (was "
                f"{printable(result.source_before)})."
            )
    print(f"The next run of {result.table} reads {printable(result.next_run_reads)}.")
    return 0


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}" if hasattr(os, "getuid") else "unknown"


# -- explain ------------------------------------------------------------------------------


def _explain(args: argparse.Namespace) -> int:
    from incremental_assets.engine.explain import explain

    project = _project(args.tables)
    spec = _table(project, args.table)
    if spec.landing is not None:
        return _explain_landing(spec, _target(project, spec), args.json)
    request = _request(spec, args.partition)
    spark = _spark(project, "incremental-assets-explain")
    plan = explain(spark, spec, _target(project, spec), request)
    if args.json:
        print(json.dumps(plan.to_json(), indent=2))
        return 0
    print(printable(f"{plan.table}, partition {plan.partition} ({plan.mode}); nothing is written"))
    lines = [
        ("watermark", f"{plan.cursor_before} -> {plan.cursor_after}"),
        ("high-water", f"{plan.high_water} (the source's, captured now)"),
        ("window", plan.window),
        ("source", plan.source),
        ("predicate", plan.predicate),
    ]
    if plan.source_files:
        read, total = plan.source_files
        lines.append(("source files", f"{read} of {total} after min/max pruning"))
    lines.append(("rows", f"{plan.rows} in the window (before keeping the newest per key)"))
    for key, (lo, hi) in plan.key_range.items():
        lines.append(("key range", f"{key} {lo} .. {hi}"))
    if plan.target_files is None:
        lines.append(("target files", plan.note))
    else:
        touched = f"{len(plan.target_files)} of {plan.target_files_total}"
        size = f" ({_bytes(plan.target_bytes or 0)})" if plan.target_files else ""
        lines.append(("target files", f"{touched}{size} the merge may rewrite, by key range"))
        lines += [("", path) for path in plan.target_files[:5]]
        if len(plan.target_files) > 5:
            lines.append(("", f"... {len(plan.target_files) - 5} more (--json lists all)"))
        if plan.note:
            lines.append(("", plan.note))
    _print_lines(lines)
    return 0


def _print_lines(lines: list[tuple[str, str]]) -> None:
    """Labelled lines, each value escaped: paths and windows come from specs and logs."""
    width = max(len(label) for label, _ in lines)
    for label, text in lines:
        print(f"  {label:<{width}}  {printable(str(text))}")


def _explain_landing(spec, target, as_json: bool) -> int:
    from incremental_assets.engine.explain import explain_landing

    plan = explain_landing(spec, target)
    if as_json:
        print(json.dumps(plan.to_json(), indent=2))
        return 0
    print(
        printable(
            f"{plan.table}, landing folder {plan.folder}; listed only, nothing is read or written"
        )
    )
    wait = f"settling (read once {plan.settle} old"
    wait += f" and <file>{plan.marker} exists)" if plan.marker else ")"
    size = sum(f.size for f in plan.pending)
    lines = [
        ("ready files", f"{plan.ready} ({plan.known} already loaded or quarantined)"),
        ("next run loads", f"{len(plan.pending)} new file versions ({_bytes(size)})"),
        *[("", f"{f.path}  {_bytes(f.size)}  {_text(f.modified)}") for f in plan.pending[:10]],
    ]
    if len(plan.pending) > 10:
        lines.append(("", f"... {len(plan.pending) - 10} more (--json lists all)"))
    lines.append(("waiting", f"{len(plan.waiting)} {wait}"))
    lines += [("", f.path) for f in plan.waiting[:5]]
    _print_lines(lines)
    return 0


def _request(spec, partition: str | None):
    from incremental_assets.dagster_layer.partitions import partitions_for
    from incremental_assets.engine.windows import LoadRequest

    partitions = partitions_for(spec)
    if partition is None:
        partition = partitions.get_last_partition_key()
        if partition is None:
            raise CliError(
                f"table '{spec.name}' has no partition yet (partitioning.start is "
                f"{spec.partitioning.start.isoformat()}); pass --partition"
            )
    first, _, last = partition.partition("...")
    last = last or first
    for key in (first, last):
        if not partitions.has_partition_key(key):
            example = partitions.get_last_partition_key() or "-"
            raise CliError(
                f"'{key}' is not a partition of table '{spec.name}' "
                f"({spec.partitioning.granularity} partitions from "
                f"{partitions.get_first_partition_key()} to {example}); pass e.g. "
                f"--partition {example}"
            )
    start = partitions.time_window_for_partition_key(first).start
    end = partitions.time_window_for_partition_key(last).end
    if end <= start:
        raise CliError(f"partition range {partition} is empty; write FIRST...LAST, in order")
    return LoadRequest(
        partition_start=start,
        partition_end=end,
        backfill=first != last,
        run_id="explain",
        partition_label=partition,
    )


# -- shared -------------------------------------------------------------------------------


def _tables_path(arg: str | None) -> Path:
    # The same default as the Dagster code location (incremental_assets.definitions).
    return Path(arg or os.environ.get("INCREMENTAL_ASSETS_TABLES") or PROJECT_ROOT / "tables.yaml")


def _project(arg: str | None):
    from incremental_assets.specs import load_project

    path = _tables_path(arg)
    if not path.is_file():
        raise CliError(
            f"tables file {path} does not exist; pass --tables FILE or set "
            "INCREMENTAL_ASSETS_TABLES"
        )
    return load_project(path)


def _table(project, name: str):
    names = [t.name for t in project.tables]
    if name not in names:
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise CliError(f"no table named '{name}'{hint}; tables are: {', '.join(names)}")
    return project.table(name)


def _spark(project, app_name: str):
    """A Spark session with the project's settings (as the Dagster resource has)."""
    from incremental_assets.engine.spark.settings import project_conf
    from incremental_assets.engine.spark_session import start_session

    return start_session(project_conf(project), app_name)


def _target(project, spec):
    from incremental_assets.engine.delta_lake.store import DeltaTarget

    # Object stores: warehouse.storage_options, and credentials from the environment
    # (AWS_*, AZURE_*, ...), as the Dagster resource gets them by default.
    return DeltaTarget(
        spec.name,
        project.target_path(spec),
        project.warehouse.storage_options,
        read_by=project.readers_of(spec),
        catalog_table=spec.target.table,
    )


def _text(value: object) -> str:
    from incremental_assets.engine.watermarks import format_value

    return format_value(value) if value is not None else "-"  # type: ignore[arg-type]


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    shown = [f"{n}{unit}" for n, unit in parts if n][:2]
    return " ".join(shown) or "0s"


def _bytes(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024  # type: ignore[assignment]
    return f"{size} B"


def _aligned(rows: list[tuple]) -> str:
    """Columns lined up; each cell escaped (incremental_assets/terminal.py), so a value
    from the log cannot break the table's lines."""
    cells = [[printable(str(v)) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join(
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


if __name__ == "__main__":
    sys.exit(main())
