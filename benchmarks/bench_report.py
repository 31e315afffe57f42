"""The printout of ``incremental_vs_full.py``: every contender side by side, the aims met or
not, and where this project's incremental run spends its time (by phase, by Spark job)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the benchmark's own types; imported there at run time
    from incremental_vs_full import Aging, CaseResult, Huge, Run

ORDER = [
    "floor",
    "notebook MERGE",
    "dlt",
    "this project",
    "this project, deletion vectors",
    "hand-written reload",
    "hand-written copy",
    "engine reload",
]
INCREMENTAL = ["this project", "this project, deletion vectors"]
# Runs of the engine whose phases and Spark jobs the report shows: the incremental runs, and
# the reload of all history (a backfill), whose aim is the hand-written reload's time.
PHASED = [*INCREMENTAL, "engine reload"]
MB = 1e6


def table(header: Sequence[str], body: Sequence[Sequence[str]], left: int = 1) -> str:
    """A plain text table; the first ``left`` columns aligned left, the rest right."""
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return " | ".join(
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    rule = "-+-".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *[line(r) for r in body]])


def _size(rows: int) -> str:
    return f"{rows / 1e6:g}M" if rows >= 1_000_000 else f"{rows:,}"


def _read(run: Run) -> str:
    m = run.measure
    if run.spark:
        return f"{m.bytes_read / MB:,.0f}"
    return f"{m.os_read_bytes / MB:,.0f}*"


def _files(run: Run) -> str:
    text = f"-{run.files_removed} +{run.files_added}"
    return text + (f" dv{run.deletion_vectors}" if run.deletion_vectors else "")


def contenders(results: list[CaseResult]) -> str:
    body = []
    for r in results:
        engine = r.runs.get("this project")
        for name in ORDER:
            run = r.runs.get(name)
            if run is None:
                continue
            ratio = run.seconds / engine.seconds if engine and engine.seconds else float("nan")
            body.append(
                [
                    r.case.name,
                    _size(r.rows),
                    name,
                    f"{run.seconds:.2f}",
                    _spread(run),
                    f"{run.measure.cpu_seconds:.1f}" if run.spark else "-",
                    f"{ratio:.2f}x",
                    f"{run.rows_written:,}",
                    _read(run),
                    f"{run.measure.files_read if run.spark else '-'}",
                    _files(run),
                    f"{len(run.measure.jobs) if run.spark else '-'}",
                    f"{run.measure.heap_peak / MB:,.0f}" if run.spark else "-",
                    f"{max(run.measure.jvm_rss_peak, run.measure.python_rss_peak) / MB:,.0f}",
                ]
            )
    return table(
        [
            "case",
            "size",
            "contender",
            "s",
            "runs: s",
            "task CPU s",
            "s / this project",
            "rows written",
            "MB read",
            "files read",
            "target files -removed +added",
            "Spark jobs",
            "heap peak MB",
            "RSS peak MB",
        ],
        body,
        left=3,
    )


def _spread(run: Run) -> str:
    """Each run's seconds, when the contender ran more than once (``s`` is their median)."""
    if len(run.repeats) < 2:
        return "1 run"
    return f"{len(run.repeats)}: {min(run.repeats):.2f}-{max(run.repeats):.2f}"


def phases(results: list[CaseResult]) -> str:
    body = []
    for r in results:
        for name in PHASED:
            run = r.runs.get(name)
            if run is None or run.result is None:
                continue
            by_phase = run.measure.by_phase()
            seconds = run.result.phase_seconds
            cells = [
                f"{seconds.get(phase, 0):.2f} ({len(by_phase.get(phase, []))})"
                for phase in ("probe", "extract", "commit")
            ]

            after = run.seconds - sum(seconds.get(k, 0) for k in ("probe", "extract", "commit"))
            merge = _merge_seconds(run)
            body.append(
                [
                    r.case.name,
                    _size(r.rows),
                    name,
                    *cells,
                    f"{max(after, 0):.2f} ({len(by_phase.get('after commit', []))})",
                    f"{merge:.2f}" if merge is not None else "-",
                    f"{run.result.rows_extracted:,}/{run.result.rows_staged:,}/"
                    f"{run.result.rows_late:,}",
                    f"{r.empty_s:.2f}",
                ]
            )
    return table(
        [
            "case",
            "size",
            "run",
            "probe s (jobs)",
            "extract s (jobs)",
            "commit s (jobs)",
            "after commit s (jobs)",
            "of which MERGE s",
            "rows extracted/staged/late",
            "empty run s",
        ],
        body,
        left=3,
    )


def _merge_seconds(run: Run) -> float | None:
    """The MERGE's own time (Delta's ``executionTimeMs``), from its jobs' span: the jobs
    Delta names after the MERGE."""
    jobs = [j for j in run.measure.jobs if "MERGE" in j.label]
    if not jobs:
        return None
    start = min(j.submitted for j in jobs)
    end = max(j.submitted + j.seconds for j in jobs)
    return end - start


def jobs(results: list[CaseResult], which: str) -> str:
    if which == "none":
        return ""
    largest = {}
    for r in results:
        largest[r.case.name] = max(largest.get(r.case.name, 0), r.rows)
    parts = []
    for r in results:
        if which == "largest" and r.rows != largest[r.case.name]:
            continue
        for name in PHASED:
            run = r.runs.get(name)
            if run is None:
                continue
            body = [
                [
                    j.phase,
                    str(j.id),
                    f"{j.seconds:.2f}",
                    f"{j.cpu_seconds:.2f}",
                    str(j.stages),
                    str(j.files_read),
                    f"{j.bytes_read / MB:,.1f}",
                    f"{j.input_records:,}",
                    f"{j.output_records:,}",
                    f"{j.shuffle_bytes / MB:,.1f}",
                    j.label[:90],
                ]
                for j in run.measure.jobs
            ]
            parts.append(
                f"{r.case.name} at {_size(r.rows)}, {name}: {len(run.measure.jobs)} Spark jobs "
                f"in {run.seconds:.2f}s\n"
                + table(
                    [
                        "phase",
                        "job",
                        "s",
                        "task CPU s",
                        "stages",
                        "files read",
                        "MB read",
                        "rows read",
                        "rows written",
                        "shuffle MB",
                        "what (Delta's description, or the call site)",
                    ],
                    body,
                )
            )
    return "\n\n".join(parts)


# --- the aims -------------------------------------------------------------------------


def _verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("met" if ok else "NOT met")


def aims(results: list[CaseResult], agings: list[Aging], big: Huge | None) -> str:
    body = []
    cases = list(dict.fromkeys(r.case.name for r in results))
    for case in cases:
        rows = sorted((r for r in results if r.case.name == case), key=lambda r: r.rows)
        for variant in INCREMENTAL:
            if not any(variant in r.runs for r in rows):
                continue
            body += _case_aims(case, variant, rows)
    for a in agings:
        ratio = a.scan_s / a.compacted_scan_s if a.compacted_scan_s else float("nan")
        variant = "this project" + ("" if a.variant == "default" else f", {a.variant}")
        body.append(
            [
                a.case,
                variant,
                f"full scan after {a.runs} runs <= 1.2x a compacted copy",
                f"{_size(a.rows)}: {a.scan_s:.2f}s vs {a.compacted_scan_s:.2f}s = {ratio:.2f}x "
                f"({a.files} files vs {a.files_compacted}; the compacted copy against itself "
                f"{a.compacted_again_s / a.compacted_scan_s if a.compacted_scan_s else 0:.2f}x"
                + (
                    f"; maintenance every {a.maintain_every} runs, {a.maintenance_s:.1f}s in all"
                    if a.maintain_every
                    else "; no maintenance"
                )
                + (
                    ""
                    if a.compact_after is None
                    else f"; compact_after {a.compact_after}: "
                    f"{len(a.compacted_runs)} runs compacted"
                )
                + (
                    ""
                    if a.purge_after is None
                    else f"; purge_after {a.purge_after}: {len(a.purged_runs)} runs purged"
                )
                + ")",
                _verdict(ratio <= 1.2),
            ]
        )
    if big is not None:
        peak = max(big.run.measure.heap_peak, big.run.measure.jvm_rss_peak)
        body.append(
            [
                "upsert",
                "this project",
                f"{_size(big.rows)} target: one increment, driver peak <= 4 GB",
                f"{big.run.seconds:.2f}s, heap peak {big.run.measure.heap_peak / 2**30:.2f} "
                f"GiB, JVM resident peak {big.run.measure.jvm_rss_peak / 2**30:.2f} GiB",
                _verdict(peak <= 4 * 2**30),
            ]
        )
    return table(["case", "run", "aim", "measured", "verdict"], body, left=4)


def _case_aims(case: str, variant: str, rows: list[CaseResult]) -> list[list[str]]:
    out = []

    def s(r: CaseResult, name: str) -> float | None:
        run = r.runs.get(name)
        return run.seconds if run else None

    # Faster than the notebook MERGE and dlt at every size, in the same run.
    parts, ok = [], True
    for r in rows:
        mine, nb, dlt = s(r, variant), s(r, "notebook MERGE"), s(r, "dlt")
        if mine is None:
            continue
        others = [x for x in (nb, dlt) if x is not None]
        ok = ok and all(mine < x for x in others)
        parts.append(
            f"{_size(r.rows)} {mine:.1f} vs {nb:.1f}" + (f"/{dlt:.1f}" if dlt is not None else "")
        )
    out.append([case, variant, "faster than notebook MERGE / dlt", "; ".join(parts), _verdict(ok)])

    first, last = rows[0], rows[-1]
    a, b = s(first, variant), s(last, variant)
    if a and b and last.rows > first.rows:
        growth = b / a
        out.append(
            [
                case,
                variant,
                f"growth {_size(first.rows)} -> {_size(last.rows)} <= 1.5x",
                f"{a:.2f}s -> {b:.2f}s = {growth:.2f}x",
                _verdict(growth <= 1.5),
            ]
        )

    parts, ok = [], True
    for r in rows:
        run = r.runs.get(variant)
        if run is None or run.result is None:
            continue
        changed = run.result.rows_inserted + run.result.rows_updated + run.result.rows_deleted
        ratio = run.rows_written / changed if changed else float("inf")
        ok = ok and ratio <= 2
        parts.append(f"{_size(r.rows)} {run.rows_written:,}/{changed:,} = {ratio:.1f}x")
    out.append([case, variant, "rows written <= 2x rows changed", "; ".join(parts), _verdict(ok)])

    if variant == "this project":
        parts, ok = [], True
        for r in rows:
            engine, hand = s(r, "engine reload"), s(r, "hand-written reload")
            if engine is None or hand is None:
                continue
            ok = ok and engine <= 1.2 * hand
            part = f"{_size(r.rows)} {engine:.1f}/{hand:.1f} = {engine / hand:.2f}x"
            copy = s(r, "hand-written copy")
            if copy is not None:
                part += f" (the copy {copy:.1f}: {engine / copy:.2f}x)"
            parts.append(part)
        out.append(
            [case, "engine reload", "<= 1.2x the hand-written reload", "; ".join(parts),
             _verdict(ok if parts else None)]
        )  # fmt: skip

    hand, mine = s(last, "hand-written reload"), s(last, variant)
    if hand and mine:
        out.append(
            [
                case,
                variant,
                f"at {_size(last.rows)} >= 20x faster than the hand-written reload",
                f"{hand:.1f}s / {mine:.2f}s = {hand / mine:.1f}x",
                _verdict(hand / mine >= 20),
            ]
        )
    return out


def report(results: list[CaseResult], agings: list[Aging], big: Huge | None, args) -> str:
    order = [c.name for c in args.cases]
    results = sorted(results, key=lambda r: (order.index(r.case.name), r.rows))
    parts = []
    if results:
        increments = {r.case.scenario.name: r.increment.description for r in results}
        parts += [
            f"One {args.increment:,}-change increment, every way, in one process "
            "(compare within this run; the machine is shared)",
            *[f"  {name}: {text}" for name, text in increments.items()],
            *[f"  {c.name}: {c.note}" for c in args.cases if c.note],
            f"  s: the median of {args.repeats} runs, each on a fresh copy of the target "
            "(runs: s, the fastest and the slowest); the floor, the notebook MERGE and this "
            "project take turns; dlt runs once (it keeps its own state), the reloads once.",
            "  task CPU s: CPU time of the run's Spark tasks (steadier than seconds on a busy "
            "machine). MB read: the size of the files Spark's scans read; * dlt: bytes its "
            "process read (the OS's count). heap: the driver JVM's heap in use, sampled every "
            "0.1 s; RSS: the larger of the driver JVM's and this Python process's.",
            "",
            contenders(results),
            "",
            "Where this project's runs spend their time (the incremental run, and the reload "
            "of all history; phase seconds, Spark jobs in brackets):",
            phases(results),
        ]
        detail = jobs(results, args.jobs)
        if detail:
            parts += ["", detail]
        checks = [f"{r.case.name} {_size(r.rows)}: {c}" for r in results for c in r.checks]
        parts += ["", "checks: " + ("; ".join(checks) if checks else "all ok")]
    parts += ["", "Aims (issue 25):", aims(results, agings, big)]
    if agings:
        parts += [
            "",
            "Repeated runs: seconds of each run "
            + "; ".join(
                f"{a.case} ({a.variant}): " + " ".join(f"{x:.1f}" for x in a.run_seconds)
                for a in agings
            ),
            "",
            "Repeated runs: thousands of rows each run wrote to the target "
            + "; ".join(
                f"{a.case} ({a.variant}): "
                + " ".join(f"{x / 1000:.0f}" for x in a.run_rows_written)
                for a in agings
            ),
            *(
                [
                    "",
                    "Repeated runs that compacted (target.compact_after): run number, seconds "
                    "of its compaction "
                    + "; ".join(
                        f"{a.case} ({a.variant}): "
                        + (" ".join(f"#{n} {s:.1f}" for n, s in a.compacted_runs) or "none")
                        for a in agings
                    ),
                ]
                if any(a.compact_after for a in agings)
                else []
            ),
            *(
                [
                    "",
                    "Repeated runs that purged (target.purge_after): run number, seconds of "
                    "its purge (and compaction) "
                    + "; ".join(
                        f"{a.case} ({a.variant}): "
                        + (" ".join(f"#{n} {s:.1f}" for n, s in a.purged_runs) or "none")
                        + (
                            f" (the other runs' purge and compaction counts: median "
                            f"{statistics.median(a.idle_upkeep_s):.2f}s)"
                            if a.idle_upkeep_s
                            else ""
                        )
                        for a in agings
                    ),
                ]
                if any(a.purge_after for a in agings)
                else []
            ),
            "",
            "Layout after the repeated runs (each live file: lowest-highest key, thousands of "
            "rows; * a file whose keys overlap the one before it):",
            *(f"  {a.case} ({a.variant}): {_layout(a.layout)}" for a in agings),
        ]
    if big is not None:
        nb = big.notebook
        parts += [
            "",
            f"{_size(big.rows)} target: initial load {big.initial_s:.0f}s; the increment: this "
            f"project {big.run.seconds:.2f}s ({big.run.rows_written:,} rows written, "
            f"{len(big.run.measure.jobs)} jobs), notebook MERGE {nb.seconds:.2f}s "
            f"({nb.rows_written:,} rows written, {len(nb.measure.jobs)} jobs, heap peak "
            f"{nb.measure.heap_peak / 2**30:.2f} GiB)",
            jobs_of(big),
        ]
    return "\n".join(parts)


def jobs_of(big: Huge) -> str:
    run = big.run
    return table(
        ["phase", "job", "s", "files read", "MB read", "rows read", "what"],
        [
            [
                j.phase,
                str(j.id),
                f"{j.seconds:.2f}",
                str(j.files_read),
                f"{j.bytes_read / MB:,.1f}",
                f"{j.input_records:,}",
                j.label[:90],
            ]
            for j in run.measure.jobs
        ],
    )


def _layout(files: list) -> str:
    """Files in key order, ``[low-high: rows k]``, an overlap with the file before starred."""
    out, high = [], None
    for low, top, rows in files:
        overlaps = high is not None and low is not None and low <= high
        out.append(f"{'*' if overlaps else ''}[{low}-{top}: {rows / 1000:.0f}k]")
        if top is not None and (high is None or top > high):
            high = top
    return " ".join(out)
