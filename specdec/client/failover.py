"""`specdec replicas --failover-demo`: a bench through the balancer, one replica's tritonserver
killed (SIGKILL) in the middle of it, and what the clients saw.

What it checks, from the bench's own records and haproxy's stats socket: the requests in flight
on the killed replica fail with an error (none hangs: each ends within FAIL_WITHIN_S of the kill),
haproxy marks the replica down within DOWN_WITHIN_S, every request sent after that succeeds, and
the bench counts the failures in its report. Before the kill both replicas have served requests.
A request sent in between, after the kill and before haproxy knew (its next checks, half a second
apart), may reach the dead replica's edge, which answers UNAVAILABLE at once: counted apart.
The killed replica's `specdec serve` starts its tritonserver again; haproxy takes it back once it
is ready, which may come after the bench has ended.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.table import Table
from rich.text import Text

from specdec.client.loadgen import BASELINE, Arm, BenchConfig, BenchResult, Load, run_bench
from specdec.client.machine import describe
from specdec.client.report import terminal_table, write_report
from specdec.client.server_stats import scrape, total
from specdec.client.workloads import WorkloadOptions, load_workload
from specdec.config import Profile
from specdec.progress import console
from specdec.triton.replicas import ClusterInfo, ReplicaInfo

DOWN_WITHIN_S = 10.0  # haproxy: 2 failed checks a second apart, and the supervisor's state at once
FAIL_WITHIN_S = 10.0  # a request in flight on the killed replica ends (fails) within this of the kill
POLL_S = 0.1


@dataclass
class FailoverReport:
    victim: str
    requests: int
    # each replica's finished requests (specdec_requests_total) at the kill, and the victim's in flight
    served_before_kill: dict[str, float] = field(default_factory=dict)
    victim_in_flight: float = 0.0
    # seconds since the bench started (the clock of bench.json's request times), which was
    # time.perf_counter() = clock_t0 (one clock for every process of the machine, on Linux)
    clock_t0: float = 0.0
    kill_s: float | None = None
    down_s: float | None = None  # when haproxy had the victim DOWN in every backend
    up_again_s: float | None = None  # when it had it UP again (its supervisor restarted it), if before the end
    failed: list[dict] = field(default_factory=list)  # start, end, reason, error
    failed_in_flight: int = 0  # of them, sent before the kill
    failed_before_down: int = 0  # sent after the kill, before haproxy had the replica down
    succeeded_after_down: int = 0
    failed_after_down: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def write(self, path: Path) -> None:
        path.write_text(json.dumps({**asdict(self), "passed": self.passed}, indent=1))


def requests_finished(replica: ReplicaInfo) -> tuple[float, float] | None:
    """(finished, in flight) requests of a replica's spec_decode; None when its metrics do not answer."""
    samples = scrape(replica.metrics_url, timeout=1)
    if samples is None:
        return None
    in_flight = total(samples, "specdec_requests_running") + total(samples, "specdec_requests_queued")
    return total(samples, "specdec_requests_total"), in_flight


def demo_config(profile: Profile, requests: int, concurrency: int, max_tokens: int) -> BenchConfig:
    """One arm (the profile's proposer), a closed loop, short chat answers, streamed over gRPC."""
    spec = profile.speculation
    arm = Arm(spec.proposer, spec.num_draft_tokens) if spec.proposer != "none" else BASELINE
    return BenchConfig(
        arms=(arm,),
        loads=(Load(concurrency=concurrency),),
        workloads=("chat",),
        num_requests=requests,
        warmup=1,
        request_timeout=120.0,
        transport="grpc",
        workload_options=WorkloadOptions(max_tokens=max_tokens),
    )


def run_failover(cluster: ClusterInfo, profile: Profile, output_dir: Path, requests: int = 40, concurrency: int = 4,
                 max_tokens: int = 48, victim: int = -1, say=console.print) -> FailoverReport:  # fmt: skip
    """Run the demo against a ready cluster (all replicas UP); write bench.json & co and
    failover.json into output_dir; return the report (its `problems`: each claim that failed)."""
    target = cluster.replicas[victim]
    report = FailoverReport(target.name, requests)
    config = demo_config(profile, requests, concurrency, max_tokens)
    prompts = {"chat": load_workload("chat", config.workload_options)}
    outcome: list[BenchResult | BaseException] = []

    def bench() -> None:
        try:
            outcome.append(run_bench(config, prompts, cluster.grpc_url))
        except BaseException as err:  # the caller's to raise
            outcome.append(err)

    say(f"bench through the balancer ({cluster.grpc_url}): {requests} requests, {concurrency} at a time, "
        f"{max_tokens} tokens at most; {target.name}'s tritonserver is killed in the middle")  # fmt: skip
    before = {r.name: requests_finished(r) for r in cluster.replicas}
    thread = threading.Thread(target=bench, name="failover-bench", daemon=True)
    thread.start()

    # the kill: once a quarter of the requests are done and the victim has some in flight
    kill_at = None
    while thread.is_alive():
        now = {r.name: requests_finished(r) for r in cluster.replicas}
        done = sum((n[0] - (before[name] or (0, 0))[0]) for name, n in now.items() if n is not None)
        mine = now[target.name]
        if done >= max(2, requests // 4) and mine is not None and mine[1] >= 1 and (pid := target.tritonserver_pid()):
            report.served_before_kill = {name: n[0] - (before[name] or (0, 0))[0] for name, n in now.items() if n}
            report.victim_in_flight = mine[1]
            kill_at = time.perf_counter()  # read before the signal: the bench's thread may see it first
            os.kill(pid, signal.SIGKILL)
            say(f"killed {target.name}'s tritonserver (pid {pid}) with {mine[1]:.0f} of its requests in flight, "
                f"{done:.0f} requests done")  # fmt: skip
            break
        time.sleep(POLL_S)

    down_at = up_at = None
    while thread.is_alive() and kill_at is not None:
        status = cluster.states().get(target.name)
        if down_at is None and status == "DOWN":
            down_at = time.perf_counter()
            say(f"haproxy marked {target.name} DOWN {down_at - kill_at:.1f} s after the kill")
        elif down_at is not None and up_at is None and status == "UP":
            up_at = time.perf_counter()
            say(f"{target.name} is back: UP {up_at - kill_at:.1f} s after the kill (its supervisor restarted it)")
        time.sleep(POLL_S)
    thread.join()
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    result = outcome[0]
    if kill_at is not None and down_at is None:  # the bench ended first: go on watching
        deadline = kill_at + DOWN_WITHIN_S
        while down_at is None and time.perf_counter() < deadline:
            if cluster.states().get(target.name) == "DOWN":
                down_at = time.perf_counter()
            time.sleep(POLL_S)

    def since_start(t: float | None) -> float | None:
        return None if t is None else round(t - result.t0, 3)

    report.clock_t0 = result.t0
    report.kill_s, report.down_s, report.up_again_s = since_start(kill_at), since_start(down_at), since_start(up_at)
    sent = [s for level in result.levels for s in level.requests]
    for s in sent:
        if s.failure:
            r = s.record
            report.failed.append({"start": round(r.start - result.t0, 3), "end": round(r.end - result.t0, 3),
                                  "reason": s.failure, "error": r.error})  # fmt: skip
            if kill_at is not None and r.start < kill_at:
                report.failed_in_flight += 1
            elif kill_at is not None and (down_at is None or r.start < down_at):
                report.failed_before_down += 1
        if down_at is not None and s.record.start >= down_at:
            report.succeeded_after_down += s.failure is None
            report.failed_after_down += s.failure is not None
    judge(report, kill_at, down_at, sent)

    output_dir.mkdir(parents=True, exist_ok=True)
    paths = write_report(result, output_dir, describe(), plots=False)
    report.write(output_dir / "failover.json")
    console.print(terminal_table(result))
    for line in summary(report):
        say(line)
    say(f"reports: {paths['markdown']}, {paths['json']}, {output_dir / 'failover.json'}")
    return report


def judge(report: FailoverReport, kill_at: float | None, down_at: float | None, sent: list) -> None:
    """report.problems: each claim of the module's doc that the run does not bear out."""
    problems = report.problems
    if kill_at is None:
        problems.append("the bench ended before the kill (no replica had requests in flight)")
        return
    if len([n for n in report.served_before_kill.values() if n > 0]) < 2:
        problems.append(f"before the kill, not every replica had served requests: {report.served_before_kill}")
    if down_at is None or down_at - kill_at > DOWN_WITHIN_S:
        problems.append(f"haproxy did not mark {report.victim} down within {DOWN_WITHIN_S:.0f} s of the kill")
    sent_before_down = down_at if down_at is not None else float("inf")
    for s in sent:
        r = s.record
        if s.failure and not (r.start < sent_before_down and kill_at <= r.end <= kill_at + FAIL_WITHIN_S):
            problems.append(f"a request failed that was sent after the replica was marked down, ended before the "
                            f"kill, or more than {FAIL_WITHIN_S:.0f} s after it: {s.failure} {r.error}")  # fmt: skip
        if s.failure and not r.error:
            problems.append(f"a request failed without an error message ({s.failure})")
    if report.failed_after_down:
        problems.append(f"{report.failed_after_down} requests sent after {report.victim} was marked down failed")
    if down_at is not None and not report.succeeded_after_down:
        problems.append("no request was sent after the replica was marked down: too few requests")
    if len(report.failed) == len(sent):
        problems.append("every request failed")


def summary(report: FailoverReport) -> list[Table | Text]:
    """A table of what happened, and the verdict."""
    table = Table(title=f"failover: {report.victim}'s tritonserver killed (SIGKILL) mid-bench", show_header=False)
    table.add_column("what")
    table.add_column("seen")
    served = ", ".join(f"{name} {n:.0f}" for name, n in report.served_before_kill.items())
    table.add_row("served before the kill", served or "-")
    table.add_row("killed at", f"{report.kill_s:.1f} s into the bench" if report.kill_s is not None else "never")
    if report.kill_s is not None:
        down = f"{report.down_s - report.kill_s:.1f} s after the kill" if report.down_s is not None else "never"
        table.add_row("marked down by haproxy", down)
        reasons = sorted({f["reason"] for f in report.failed})
        table.add_row("requests failed", Text(f"{len(report.failed)}: {', '.join(reasons) or '-'}"))
        table.add_row("  in flight at the kill", f"{report.failed_in_flight} (it had {report.victim_in_flight:.0f})")
        table.add_row("  sent before marked down", str(report.failed_before_down))
        if report.failed:
            latest = max(f["end"] for f in report.failed) - report.kill_s
            table.add_row("failures ended", f"within {latest:.1f} s of the kill")
            table.add_row("e.g.", Text(str(report.failed[0]["error"])[:200]))
        table.add_row("sent after marked down", f"{report.succeeded_after_down} succeeded, "
                      f"{report.failed_after_down} failed")  # fmt: skip
        up = "not before the bench ended"
        if report.up_again_s is not None:
            up = f"{report.up_again_s - report.kill_s:.1f} s after the kill"
        table.add_row("back UP (its supervisor restarted it)", up)
    if report.passed:
        verdict = Text("failover as claimed", style="green")
    else:
        verdict = Text("NOT AS CLAIMED: ", style="red") + Text("; ".join(report.problems))
    return [table, verdict]
