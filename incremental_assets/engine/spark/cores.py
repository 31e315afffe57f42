"""The cores a ``local`` Spark master runs tasks on, counted the way Spark counts them.

``local[*]`` takes the JVM's available processors: the CPUs the process may run on, at
most a container's CPU limit (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` over
``cpu.cfs_period_us``, rounded up). A 16-core host running a container limited to 2
CPUs gives ``local[*]`` 2 threads, and so 2 here.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
# local, local[N], local[*], local[N,F] and local[*,F] (F: task retries), as Spark's
# SparkMasterRegex reads them: spaces only around the comma.
_LOCAL = re.compile(r"local(?:\[(\*|\d+)(?:\s*,\s*\d+)?\])?")


def local_cores(master: str) -> int | None:
    """The cores ``master`` runs tasks on (``local``: 1, ``local[N]``: N, ``local[*]``:
    :func:`usable_cores`); None for any other master (a cluster's, ``local-cluster[...]``)."""
    found = _LOCAL.fullmatch(master.strip())
    if found is None:
        return None
    if found.group(1) is None:
        return 1
    if found.group(1) == "*":
        return usable_cores()
    return max(1, int(found.group(1)))


def usable_cores(cgroup_root: Path = CGROUP_ROOT) -> int:
    """The CPUs this process may run on, at most its container's CPU limit."""
    affinity = getattr(os, "sched_getaffinity", None)  # not on macOS or Windows
    cpus = len(affinity(0)) if affinity else os.cpu_count() or 1
    limit = cgroup_cpu_limit(cgroup_root)
    return max(1, min(cpus, limit) if limit is not None else cpus)


def cgroup_cpu_limit(root: Path = CGROUP_ROOT) -> int | None:
    """A container's CPU limit, rounded up to whole CPUs; None when there is none (or no
    cgroup file to read: another system)."""
    v2 = _read(root / "cpu.max")
    if v2 is not None:
        quota, _, period = v2.partition(" ")
        return _ratio(quota, period)
    quota = _read(root / "cpu" / "cpu.cfs_quota_us")
    period = _read(root / "cpu" / "cpu.cfs_period_us")
    if quota is None or period is None:
        return None
    return _ratio(quota, period)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _ratio(quota: str, period: str) -> int | None:
    """``ceil(quota / period)``; None for no limit (``max``, ``-1``) or unreadable text."""
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    if q <= 0 or p <= 0:
        return None
    return max(1, math.ceil(q / p))
