"""What a timed block cost: its Spark jobs (from Spark's status REST API), the bytes they
read and wrote, and the driver's peak memory, sampled while it ran.

The benchmark's session runs with Spark's UI server on (the engine's sessions keep it
off): its REST API (``/api/v1/applications/<app>/jobs`` and ``/stages``) lists every job
with its stages' input and output, and its metrics servlet (``/metrics/json``) reports the
driver JVM's heap in use. The driver's resident memory and the bytes its processes read
come from the operating system (``/proc``), for the Spark driver JVM and for this Python
process alike, so dlt (which runs in Python, not Spark) is measured the same way. In local
mode the executors run inside the driver JVM, so its memory is the whole Spark side.

Example:
    >>> meter = Meter(spark)  # doctest: +SKIP
    >>> with meter.measure() as m:  # doctest: +SKIP
    ...     run_load(...)
    >>> m.seconds, len(m.jobs), m.heap_peak  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

# Spark settings the meter needs: the UI server (for its REST API), enough jobs and stages
# kept to list a whole benchmark's, and the driver JVM's heap as a metric.
METER_CONF = {
    "spark.ui.enabled": "true",
    "spark.ui.port": "4440",
    "spark.ui.retainedJobs": "100000",
    "spark.ui.retainedStages": "100000",
    "spark.sql.ui.retainedExecutions": "2000",
    "spark.metrics.conf.driver.source.jvm.class": "org.apache.spark.metrics.source.JvmSource",
}
SAMPLE_SECONDS = 0.1
SCANNED = ("parquet", "csv")  # the scans whose files are counted, by format


@dataclass
class Job:
    """One Spark job of a measured block."""

    id: int
    name: str  # the call site: the Python line (or Delta's operation) that ran it
    description: str
    submitted: float  # seconds since the epoch
    seconds: float
    stages: int
    input_bytes: int = 0
    input_records: int = 0
    output_bytes: int = 0
    output_records: int = 0
    shuffle_bytes: int = 0
    cpu_seconds: float = 0.0  # CPU time of its tasks (less swayed by a busy machine)
    files_read: int = 0  # Parquet files its scans read (Spark's SQL metrics)
    bytes_read: int = 0  # their size
    csv_files_read: int = 0  # CSV files its scans read (a landing folder's, say)
    csv_bytes_read: int = 0
    phase: str = ""

    @property
    def label(self) -> str:
        text = self.description or self.name
        return " ".join(text.split())


@dataclass
class Measure:
    """A measured block: wall seconds, its Spark jobs, peak driver memory (JVM heap in use,
    resident size of the JVM and of this Python process) and the bytes the two processes
    read from files (the operating system's count, cache hits included)."""

    seconds: float = 0.0
    jobs: list[Job] = field(default_factory=list)
    heap_peak: int = 0
    jvm_rss_peak: int = 0
    python_rss_peak: int = 0
    os_read_bytes: int = 0
    marks: list[tuple[str, float]] = field(default_factory=list)

    @property
    def files_read(self) -> int:
        return sum(j.files_read for j in self.jobs)

    @property
    def csv_files_read(self) -> int:
        return sum(j.csv_files_read for j in self.jobs)

    @property
    def csv_bytes_read(self) -> int:
        return sum(j.csv_bytes_read for j in self.jobs)

    @property
    def cpu_seconds(self) -> float:
        return sum(j.cpu_seconds for j in self.jobs)

    @property
    def bytes_read(self) -> int:
        return sum(j.bytes_read for j in self.jobs)

    @property
    def rows_read(self) -> int:
        return sum(j.input_records for j in self.jobs)

    def by_phase(self) -> dict[str, list[Job]]:
        out: dict[str, list[Job]] = {}
        for job in self.jobs:
            out.setdefault(job.phase, []).append(job)
        return out


class Meter:
    def __init__(self, spark):
        sc = spark.sparkContext
        self.url = (sc.uiWebUrl or "").rstrip("/")
        if not self.url:
            raise SystemExit("the benchmark needs Spark's UI server (spark.ui.enabled)")
        self.app = sc.applicationId
        self.jvm_pid = _jvm_pid()

    # -- REST --------------------------------------------------------------------------

    def _get(self, path: str):
        with urllib.request.urlopen(f"{self.url}{path}", timeout=30) as response:
            return json.load(response)

    def _jobs(self) -> list[dict]:
        return self._get(f"/api/v1/applications/{self.app}/jobs")

    def last_job_id(self) -> int:
        jobs = self._settled()
        return max((j["jobId"] for j in jobs), default=-1)

    def _settled(self) -> list[dict]:
        """The jobs list once Spark's listener has caught up: no job running, and the same
        count twice in a row."""
        before = None
        for _ in range(100):
            jobs = self._jobs()
            running = any(j["status"] == "RUNNING" for j in jobs)
            if not running and before is not None and len(jobs) == before:
                return jobs
            before = len(jobs)
            time.sleep(0.2)
        return jobs

    def _stage_totals(self) -> dict[int, dict]:
        stages = self._get(f"/api/v1/applications/{self.app}/stages")
        out: dict[int, dict] = {}
        for s in stages:
            t = out.setdefault(s["stageId"], {})
            for key in ("inputBytes", "inputRecords", "outputBytes", "outputRecords"):
                t[key] = t.get(key, 0) + int(s.get(key, 0))
            t["shuffle"] = t.get("shuffle", 0) + int(s.get("shuffleWriteBytes", 0))
            t["cpu"] = t.get("cpu", 0) + int(s.get("executorCpuTime", 0))
        return out

    def _scans(self) -> dict[int, dict[str, tuple[int, int]]]:
        """Files and bytes each job's Parquet and CSV scans read, by format, from the SQL
        executions' metrics (an execution's scans are billed to its first job). JSON scans
        are left out: Delta reads its own log as JSON, which is no data file."""
        executions = self._get(
            f"/api/v1/applications/{self.app}/sql?details=true&planDescription=false"
            "&offset=0&length=1000000"
        )
        out: dict[int, dict[str, tuple[int, int]]] = {}
        for e in executions:
            jobs = sorted([*e.get("successJobIds", []), *e.get("failedJobIds", [])])
            if not jobs:
                continue
            read: dict[str, tuple[int, int]] = {}
            for node in e.get("nodes", []):
                name = node.get("nodeName", "")
                fmt = next((f for f in SCANNED if name.startswith(f"Scan {f}")), None)
                if fmt is None:
                    continue
                files, size = read.get(fmt, (0, 0))
                for metric in node.get("metrics", []):
                    if metric["name"] == "number of files read":
                        files += int(_number(metric["value"]))
                    elif metric["name"] == "size of files read":
                        size += int(_number(metric["value"]))
                read[fmt] = (files, size)
            out[jobs[0]] = read
        return out

    def heap_used(self) -> int:
        gauges = self._get("/metrics/json").get("gauges", {})
        return int(
            next(
                (v["value"] for k, v in gauges.items() if k.endswith("driver.jvm.heap.used")),
                0,
            )
        )

    # -- measuring ---------------------------------------------------------------------

    @contextmanager
    def measure(self) -> Iterator[Measure]:
        """Measure the block; the result is filled in when the block ends."""
        out = Measure()
        first = self.last_job_id() + 1
        io_before = _read_bytes(self.jvm_pid) + _read_bytes(os.getpid())
        stop = threading.Event()
        sampler = threading.Thread(target=self._sample, args=(out, stop), daemon=True)
        sampler.start()
        started = time.perf_counter()
        self.marks = out.marks
        try:
            yield out
        finally:
            out.seconds = time.perf_counter() - started
            stop.set()
            sampler.join()
            out.os_read_bytes = _read_bytes(self.jvm_pid) + _read_bytes(os.getpid()) - io_before
            out.jobs = self._jobs_since(first, out.marks)

    def mark(self, phase: str) -> None:
        """The phase that starts now, for the jobs submitted after it (within ``measure``)."""
        self.marks.append((phase, time.time()))

    def _sample(self, out: Measure, stop: threading.Event) -> None:
        while True:
            with suppress(OSError):
                out.heap_peak = max(out.heap_peak, self.heap_used())
            out.jvm_rss_peak = max(out.jvm_rss_peak, _rss(self.jvm_pid))
            out.python_rss_peak = max(out.python_rss_peak, _rss(os.getpid()))
            if stop.wait(SAMPLE_SECONDS):
                return

    def _jobs_since(self, first: int, marks: list[tuple[str, float]]) -> list[Job]:
        jobs = [j for j in self._settled() if j["jobId"] >= first]
        stages = self._stage_totals()
        scans = self._scans()
        out = []
        for j in sorted(jobs, key=lambda j: j["jobId"]):
            submitted = _instant(j.get("submissionTime"))
            completed = _instant(j.get("completionTime")) or submitted
            job = Job(
                id=j["jobId"],
                name=j.get("name", ""),
                description=j.get("description", ""),
                submitted=submitted,
                seconds=max(completed - submitted, 0.0),
                stages=len(j.get("stageIds", [])),
            )
            for sid in j.get("stageIds", []):
                t = stages.get(sid)
                if t is None:
                    continue
                job.input_bytes += t["inputBytes"]
                job.input_records += t["inputRecords"]
                job.output_bytes += t["outputBytes"]
                job.output_records += t["outputRecords"]
                job.shuffle_bytes += t["shuffle"]
                job.cpu_seconds += t["cpu"] / 1e9
            read = scans.get(job.id, {})
            job.files_read, job.bytes_read = read.get("parquet", (0, 0))
            job.csv_files_read, job.csv_bytes_read = read.get("csv", (0, 0))
            job.phase = next((p for p, at in reversed(marks) if at <= submitted), "")
            out.append(job)
        return out


def _instant(text: str | None) -> float:
    """Spark's ``2026-11-25T20:48:13.717GMT`` as seconds since the epoch."""
    if not text:
        return 0.0
    parsed = datetime.strptime(text.removesuffix("GMT"), "%Y-%m-%dT%H:%M:%S.%f")
    return parsed.replace(tzinfo=timezone.utc).timestamp()


_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def _number(text: str) -> float:
    """A SQL metric's value: ``1,234``, ``392.9 KiB``, or a task summary whose first
    number is the total (``total (min, med, max ...)`` then ``1.9 s (955 ms, ...)``)."""
    lines = text.strip().splitlines()
    line = lines[1] if lines and lines[0].startswith("total") and len(lines) > 1 else lines[0]
    first = line.split(" (")[0].replace(",", "").split()
    if not first:
        return 0.0
    value = float(first[0])
    return value * _UNITS.get(first[1], 1) if len(first) > 1 else value


def _jvm_pid() -> int | None:
    """The Spark driver JVM: the java process this Python process started."""
    me = os.getpid()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        ppid = int(text[text.rindex(")") + 2 :].split()[1])
        if ppid == me and name == "java":
            return int(stat.parent.name)
    return None


def _rss(pid: int | None) -> int:
    if pid is None:
        return 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _read_bytes(pid: int | None) -> int:
    """Bytes the process read through read(2) and the like (``rchar``), cache hits too."""
    if pid is None:
        return 0
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0
