"""What the server says about itself: its Prometheus counters and its processes' memory.

Counters are read before and after each load level; their differences are the server's own
account of the level (drafts, acceptance per position, requests, tokens), to set beside what the
client counted. Memory is the tritonserver process and its children (one Python backend stub per
model instance), sampled while the level runs: PSS (proportional set size) adds up across
processes without counting shared libraries twice; RSS is what `top` shows. On a GPU, Triton's
own `nv_gpu_memory_used_bytes` gauge gives the device memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

SPECDEC_COUNTERS = {
    "drafts": "specdec_drafts_total",
    "draft_tokens": "specdec_draft_tokens_total",
    "accepted_tokens": "specdec_accepted_tokens_total",
    "output_tokens": "specdec_output_tokens_total",
    "requests": "specdec_requests_total",
}


def parse_prometheus(text: str) -> Samples:
    """Samples of Prometheus' text format, keyed by (name, sorted labels)."""
    samples: Samples = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:  # comments, HELP and TYPE lines
            continue
        name, labels, value = match.groups()
        try:
            samples[(name, tuple(sorted(_LABEL.findall(labels or ""))))] = float(value)
        except ValueError:
            continue
    return samples


def scrape(url: str, timeout: float = 5.0) -> Samples | None:
    """The server's metrics now; None when the endpoint does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return parse_prometheus(resp.read().decode("utf-8", errors="replace"))
    except OSError:
        return None


def delta(before: Samples, after: Samples) -> Samples:
    """after - before for every sample present after (a counter that appeared started at 0)."""
    return {key: value - before.get(key, 0.0) for key, value in after.items()}


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of a metric over the series whose labels include `labels`."""
    return sum(value for (n, series), value in samples.items() if n == name and set(labels.items()) <= set(series))


@dataclass(frozen=True)
class ProposerCounters:
    """The server's counts for one proposer over a level."""

    drafts: float
    draft_tokens: float
    accepted_tokens: float
    output_tokens: float
    requests: float
    accepted_per_position: list[float]
    drafted_per_position: list[float]


def proposer_counters(samples: Samples, proposer: str) -> ProposerCounters:
    def by_position(name: str) -> list[float]:
        values = {
            int(dict(series)["position"]): value
            for (n, series), value in samples.items()
            if n == name and dict(series).get("proposer") == proposer and "position" in dict(series)
        }
        return [values.get(i, 0.0) for i in range(1, max(values, default=0) + 1)]

    counts = {key: total(samples, name, proposer=proposer) for key, name in SPECDEC_COUNTERS.items()}
    return ProposerCounters(
        **counts,
        accepted_per_position=by_position("specdec_accepted_tokens_per_position_total"),
        drafted_per_position=by_position("specdec_draft_tokens_per_position_total"),
    )


def gpu_memory_bytes(samples: Samples) -> float | None:
    """Device memory in use over all GPUs (Triton's gauge), None on a machine without GPUs."""
    if not any(name == "nv_gpu_memory_used_bytes" for name, _ in samples):
        return None
    return total(samples, "nv_gpu_memory_used_bytes")


# --- processes ------------------------------------------------------------------------------------
def find_listening_pid(port: int) -> int | None:
    """The local process listening on a TCP port (the server, when --url names this machine);
    where that is the server's edge (specdec/triton/edge.py), the tritonserver behind it."""
    from specdec.triton.edge import upstream_port  # (aiohttp and grpc: only when asked)

    with contextlib.suppress(psutil.Error, PermissionError):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                behind = upstream_port(psutil.Process(conn.pid).cmdline())
                return conn.pid if behind is None else find_listening_pid(behind)
    return None


def process_name(cmdline: list[str]) -> str:
    """tritonserver, or the model a Python backend stub serves (from its model.py path)."""
    if cmdline and cmdline[0].endswith("triton_python_backend_stub") and len(cmdline) > 1:
        return Path(cmdline[1]).parent.parent.name
    return Path(cmdline[0]).name if cmdline else "?"


@dataclass(frozen=True)
class ProcessMemory:
    rss: int
    pss: int


def memory_snapshot(pid: int) -> dict[str, ProcessMemory]:
    """Memory of the server process and its children, by name (instances of a model add up)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return {}
    out: dict[str, ProcessMemory] = {}
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            info = proc.memory_full_info()
            name = process_name(proc.cmdline())
            prev = out.get(name, ProcessMemory(0, 0))
            out[name] = ProcessMemory(prev.rss + info.rss, prev.pss + getattr(info, "pss", info.rss))
    return out


def peak(snapshots: list[Mapping[str, ProcessMemory]]) -> dict[str, ProcessMemory]:
    """Per process, the largest value seen; and "total": the largest sum at one instant."""
    out: dict[str, ProcessMemory] = {}
    for snap in snapshots:
        for name, mem in snap.items():
            prev = out.get(name, ProcessMemory(0, 0))
            out[name] = ProcessMemory(max(prev.rss, mem.rss), max(prev.pss, mem.pss))
        prev = out.get("total", ProcessMemory(0, 0))
        now = ProcessMemory(sum(m.rss for m in snap.values()), sum(m.pss for m in snap.values()))
        out["total"] = ProcessMemory(max(prev.rss, now.rss), max(prev.pss, now.pss))
    return out


@dataclass
class MemorySampler:
    """Samples the server's memory every `interval` seconds while a level runs."""

    pid: int | None
    interval: float = 1.0
    snapshots: list[dict[str, ProcessMemory]] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        if self.pid is None:
            return
        while not stop.is_set():
            self.snapshots.append(await asyncio.to_thread(memory_snapshot, self.pid))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)


@dataclass(frozen=True)
class Resident:
    """A process's resident memory in bytes, by what backs it (/proc/<pid>/status): anonymous
    (its heap: where a leak shows), file-backed (code and mapped files: grows as pages are first
    touched, up to the files' size) and shared memory (/dev/shm: the Python backend's regions, up
    to their size)."""

    anon: int
    file: int
    shmem: int

    @property
    def rss(self) -> int:
        return self.anon + self.file + self.shmem


def read_resident(pid: int) -> Resident | None:
    """`pid`'s resident memory now; None once it is gone."""
    fields = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("RssAnon", "RssFile", "RssShmem"):
                fields[name] = int(value.split()[0]) * 1024  # kB
    except OSError:
        return None
    return Resident(fields.get("RssAnon", 0), fields.get("RssFile", 0), fields.get("RssShmem", 0))


def server_processes(roots: Mapping[str, int]) -> dict[str, list[int]]:
    """The processes to watch, by name: each root under its own name, and each root's
    descendants by process_name (a Python backend stub by its model; the instances of a model
    under one name)."""
    out: dict[str, list[int]] = {}
    for name, pid in roots.items():
        out.setdefault(name, []).append(pid)
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    out.setdefault(process_name(child.cmdline()), []).append(child.pid)
    return out


def resident_by_name(processes: Mapping[str, list[int]]) -> dict[str, Resident]:
    """The resident memory of each name of server_processes() (its processes' sum): cheap enough
    to read every few requests (one small /proc file a process)."""
    out = {}
    for name, pids in processes.items():
        parts = [r for pid in pids if (r := read_resident(pid)) is not None]
        out[name] = Resident(*(sum(getattr(r, f) for r in parts) for f in ("anon", "file", "shmem")))
    return out
