"""The `check` and `bench` commands behind the CLI: find or start the server, run, report."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from specdec.client.check import CheckArm, CheckReport, Sampled, run_check
from specdec.client.client import Access, TritonClient
from specdec.client.loadgen import BASELINE, Arm, BenchConfig, run_bench
from specdec.client.machine import describe
from specdec.client.report import sampling_line, terminal_table, write_report
from specdec.client.server_stats import find_listening_pid
from specdec.client.workloads import Prompt, WorkloadOptions, load_workload
from specdec.config import Profile
from specdec.progress import console, progress_bar
from specdec.tokenizer import TextTokenizer
from specdec.triton.internal import InternalAccess, access_path, read_access_file
from specdec.triton.serve import embedded_server


@dataclass(frozen=True)
class ServerHandle:
    url: str  # for the chosen transport
    metrics_url: str | None
    pid: int | None  # for memory; None when the server is not on this machine
    # tritonserver's own endpoint and the key of its start, for calls to internal models (spec_decode):
    # only a server on this machine, whose access file this user can read (specdec/triton/internal.py)
    internal: InternalAccess | None = None


@contextlib.contextmanager
def server_for(profile: Profile, url: str | None, transport: str = "grpc", metrics_url: str | None = None,
               server_pid: int | None = None) -> Iterator[ServerHandle]:  # fmt: skip
    """The server at `url`, or else the profile's, started for the block and stopped after."""
    if url:
        host, _, port = url.rpartition(":")
        local = host in ("127.0.0.1", "localhost", "::1") and port.isdigit()
        pid = server_pid or (find_listening_pid(int(port)) if local else None)
        internal = read_access_file(access_path(profile.build_path(), int(port))) if local else None
        yield ServerHandle(url, metrics_url or f"http://{host}:{profile.server.metrics_port}/metrics", pid, internal)
        return
    with embedded_server(profile) as (grpc_url, http_url, server):
        urls = {"grpc": grpc_url, "http": http_url, "openai": f"{server.host}:{server.ports.openai}"}
        yield ServerHandle(
            urls[transport],
            server.metrics_url,
            server.process.pid if server.process else None,
            server.internal,
        )


def tokenizer_for(profile: Profile) -> TextTokenizer | None:
    model_dir = profile.model_dir("target")
    return TextTokenizer(model_dir) if (model_dir / "tokenizer.json").is_file() else None


def default_arms(profile: Profile) -> list[Arm]:
    """The baseline, the profile's proposer at its draft length, and the draft model when there is one."""
    spec = profile.speculation
    arms = [BASELINE]
    if spec.proposer != "none":
        arms.append(Arm(spec.proposer, spec.num_draft_tokens))
    if profile.draft is not None and spec.proposer != "draft_model":
        arms.append(Arm("draft_model", spec.num_draft_tokens))
    return arms


# --- check ----------------------------------------------------------------------------------------
def _check_table(report: CheckReport, sampled: bool) -> Table:
    table = Table(title=f"{'sampled' if sampled else 'greedy'} tokens against the baseline (speculation off)")
    for col in ("arm", "prompts", "identical", "first difference (prompt: token)", "acceptance", "errors"):
        table.add_column(col, justify="right" if col in ("prompts", "identical", "acceptance", "errors") else "left")
    for arm in report.arms[1:]:
        records = report.records[arm.name]
        diffs = [m for m in report.mismatches if m.arm == arm.name]
        drafted = sum(r.total_draft_tokens for r in records)
        accepted = sum(r.total_accepted_draft_tokens for r in records)
        errors = sum(r.error is not None for r in records)
        table.add_row(
            arm.name,
            str(len(records)),
            str(len(records) - len(diffs) - errors),
            ", ".join(f"{m.prompt}: {m.position}" for m in diffs) or "-",
            f"{accepted / drafted:.0%}" if drafted else "-",
            str(errors),
        )
    return table


def check(profile: Profile, url: str | None, arms: Sequence[CheckArm], workload: str, num_prompts: int,
          max_tokens: int, concurrency: int, sampled: Sampled | None = None,
          access: Access | None = None) -> int:  # fmt: skip
    with server_for(profile, url) as server:
        tokenizer = tokenizer_for(profile)
        if tokenizer is None:
            console.print(f"[red]error:[/] the check needs the target's tokenizer in {profile.model_dir('target')}: "
                          "run `specdec build` for this profile")  # fmt: skip
            return 2
        prompts = load_workload(workload, WorkloadOptions(max_tokens=max_tokens), tokenizer)[:num_prompts]
        prompt_ids = [tokenizer.prompt_ids(p.text, p.apply_chat_template) for p in prompts]
        if (internal := server.internal) is None:
            keys = access_path(profile.build_path(), 0).parent
            console.print(f"[red]error:[/] the check sends token ids to spec_decode, an internal model: run it on "
                          f"the server's machine as the server's user, with the server's gRPC port in --url (it "
                          f"reads the key of the server's start in {keys})")  # fmt: skip
            return 2

        async def main() -> CheckReport:
            async with TritonClient(internal.grpc_url, access or Access(), internal.key) as client:
                with progress_bar(transient=True) as progress:
                    task = progress.add_task("check", total=len(prompts) * (len(arms) + 1))
                    return await run_check(client, prompt_ids, arms, max_tokens, tokenizer.eos_id, concurrency,
                                           on_done=lambda: progress.advance(task), sampled=sampled)  # fmt: skip

        report = asyncio.run(main())
    how = "greedy"
    if sampled is not None:
        how = f"sampled at {sampling_line(sampled.temperature, sampled.top_p)}, prompt i with seed {sampled.seed} + i"
    console.print(_check_table(report, sampled is not None))
    for m in report.mismatches:
        ids = report.records[m.arm][m.prompt].ids
        console.print(
            f"[red]differs[/] {m.arm} prompt {m.prompt} ({prompts[m.prompt].text[:60]!r}...) at token {m.position}: "
            f"baseline {m.expected} {tokenizer.decode([m.expected]) if m.expected is not None else '(end)'!r}, "
            f"got {m.got} {tokenizer.decode([m.got]) if m.got is not None else '(end)'!r}; "
            f"common prefix: {tokenizer.decode(ids[: m.position])[-80:]!r}",
            highlight=False,
        )
    for arm, prompt, error in report.errors:
        console.print(f"[red]error[/] {arm} prompt {prompt}: {error}", highlight=False)
    verdict = "[green]all identical[/]" if report.passed else "[red]DIFFERENCES OR ERRORS[/]"
    console.print(f"{verdict}: {len(prompts)} prompts x {len(arms)} arms, {max_tokens} tokens at most, {how}")
    return 0 if report.passed else 1


# --- bench ----------------------------------------------------------------------------------------
def bench(profile: Profile, url: str | None, config: BenchConfig, output_dir: Path, metrics_url: str | None = None,
          server_pid: int | None = None, plots: bool = True, access: Access | None = None) -> int:  # fmt: skip
    """Run the bench and write its report, whatever failed along the way: 0 when some requests
    succeeded, 1 when none did."""
    with server_for(profile, url, config.transport, metrics_url, server_pid) as server:
        tokenizer = tokenizer_for(profile)
        prompts: dict[str, list[Prompt]] = {
            w: load_workload(w, config.workload_options, tokenizer) for w in config.workloads
        }
        # input_sequence_length: the prompt text's tokens, as genai-perf counts them
        lengths = {w: [len(tokenizer.encode(p.text)) for p in ps] for w, ps in prompts.items()} if tokenizer else None
        result = run_bench(config, prompts, server.url, server.metrics_url, server.pid, lengths, access)
    paths = write_report(result, output_dir, describe(), plots=plots)
    console.print(terminal_table(result))
    measured = sum(len(level.requests) for level in result.levels)
    failures = result.failures
    if failures:
        reasons = ", ".join(f"{reason} {n}" for reason, n in failures.most_common())
        console.print(f"[yellow]{sum(failures.values())} of {measured} requests failed[/] ({reasons}), "
                      f"e.g. {result.errors[0]}", highlight=False)  # fmt: skip
    exports = [p for kind, p in paths.items() if kind.startswith("genai-perf ")]
    console.print(f"all tables: {paths['markdown']}\nwrote "
                  + ", ".join(str(p) for kind, p in paths.items() if not kind.startswith("genai-perf "))
                  + f"\nand {len(exports)} genai-perf exports: {output_dir}/<workload>/<level>/<arm>/"
                  "profile_export_genai_perf.{json,csv}")  # fmt: skip
    return 0 if measured > sum(failures.values()) else 1
