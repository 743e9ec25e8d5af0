"""docs/performance.md, generated from the latest run of each benchmark in benchmarks/results/.

    .venv/bin/python benchmarks/performance.py [--check]

Each benchmark script that writes results keeps its latest run in a folder of its own under
benchmarks/results/ (targets/, readme/, copy_bound/, crosscheck/, soak/, startup/, gpu_check/), the next
run overwriting it, and calls update() at its end, so that the document follows the results. It
holds a section a benchmark: what it measures (the first paragraph of its script's docstring), the
command that reproduces the run (from what the run recorded), the machine it ran on (from its own
report) and its tables and figures, copied from its report files with their links made relative
to docs/. --check only compares: it exits 1 where docs/performance.md differs from what the
results give (tests/unit/benchmarks/test_performance.py asserts the same).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent
RESULTS = BENCHMARKS / "results"
DOC = BENCHMARKS.parent / "docs" / "performance.md"
PYTHON = ".venv/bin/python"
TARGETS_CONCURRENCY = (1, 2, 4, 8, 16, 32)  # targets.py's CONCURRENCY: its default --concurrency
CROSSCHECK_DEFAULTS = {"requests": 4, "max_tokens": 96}  # crosscheck.py's --requests and --max-tokens
# draft_length.py's --lengths, --num-requests and --max-tokens
DRAFT_LENGTH_DEFAULTS = {"lengths": "5,8,12,15", "num_requests": 16, "max_tokens": 128}
# edge_overhead.py's --blocks, --requests, --concurrency and --max-tokens
EDGE_DEFAULTS = {"blocks": 3, "requests": 16, "concurrency": 4, "max_tokens": 32}
STARTUP_DEFAULTS = {"rounds": 3}  # startup.py's --rounds
# soak.py's --max-tokens, --warmup, --sample-every and --max-slope
SOAK_DEFAULTS = {"max_tokens": 48, "warmup_requests": 400, "sample_every": 20, "max_slope_bytes_per_request": 1024}

MACHINE_LINE = re.compile(r"^Machine: (.+?)\.(?:\s|$)", re.MULTILINE)
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")


def purpose(script: str) -> str:
    """What a benchmark measures: the first paragraph of its script's docstring, on one line."""
    doc = ast.get_docstring(ast.parse((BENCHMARKS / f"{script}.py").read_text())) or ""
    return " ".join(doc.split("\n\n")[0].split())


def machine_summary(machine: dict) -> str:
    """specdec.client.machine.summary_line's words (this module needs nothing but the standard library)."""
    gpu = ", ".join(machine.get("gpus") or []) or "no GPU"
    load = machine.get("load_average")
    busy = f", 1-minute load average {load[0]} when written" if load else ""
    return f"{machine['cpu']}, {machine['logical_cores']} cores, {machine['memory_gib']} GiB, {gpu}{busy}"


def machine_in(path: Path) -> str | None:
    """The machine a report names on its `Machine: ...` line."""
    if not path.is_file():
        return None
    found = MACHINE_LINE.search(path.read_text())
    return found[1] if found else None


def relink(markdown: str, base: str) -> str:
    """A report's relative links and images, pointing from docs/ at the report's folder."""

    def fix(m: re.Match) -> str:
        target = m[2]
        if re.match(r"[a-z][a-z0-9+.-]*:|/|#", target):
            return m[0]
        return f"{m[1]}{base}/{target}{m[3]}"

    return LINK.sub(fix, markdown)


def code(argv: list[str]) -> str:
    return "`" + " ".join(argv) + "`"


class Section:
    """One benchmark's section: its folder under the results, and the links to it from the document."""

    def __init__(self, script: str, title: str, results: Path, link: str):
        self.script, self.title = script, title
        self.folder = results / script
        self.link = f"{link}/{script}"
        self.lines = [f"## {title}", "", f"`benchmarks/{script}.py`: {purpose(script)}", ""]

    def fields(self, command: str, machine: str | None, reports: list[str]) -> None:
        links = ", ".join(f"[{name}]({self.link}/{name})" for name in reports if (self.folder / name).exists())
        self.lines += [
            f"- Reproduce: {command}",
            f"- Ran on: {machine or 'not recorded'}",
            f"- Results: [benchmarks/results/{self.script}/]({self.link}/)" + (f" ({links})" if links else ""),
            "",
        ]

    def copy(self, name: str, heading: str | None = None) -> None:
        """A report file of the folder, verbatim but for its links."""
        path = self.folder / name
        if not path.is_file():
            return
        if heading:
            self.lines += [heading, ""]
        base = f"{self.link}/{Path(name).parent.as_posix()}".removesuffix("/.")
        self.lines += [relink(path.read_text().strip(), base), ""]

    def absent(self, command: str) -> None:
        self.lines += [f"- Reproduce: {command}", "", f"No run in benchmarks/results/{self.script}/ yet.", ""]

    def text(self) -> str:
        return "\n".join(self.lines)


def targets(section: Section) -> None:
    report_path = section.folder / "targets.json"
    if not report_path.is_file():
        section.absent(code([PYTHON, "benchmarks/targets.py"]))
        return
    report = json.loads(report_path.read_text())
    levels = report["levels"]
    sources = {r["workload"]: r["prompts"] for r in levels}
    argv = [PYTHON, "benchmarks/targets.py"]
    if sources.get("grounded", "grounded") != "grounded":
        argv += ["--grounded", sources["grounded"]]
    if sources.get("chat", "chat") != "chat":
        argv += ["--open", sources["chat"]]
    concurrency = tuple(dict.fromkeys(r["concurrency"] for r in levels))
    if concurrency != TARGETS_CONCURRENCY:
        argv += ["--concurrency", ",".join(map(str, concurrency))]
    sampled = re.fullmatch(r"temperature (\S+?)(?:, top_p (\S+))?", report.get("decoding", "greedy"))
    if sampled:
        argv += ["--temperature", sampled[1]] + (["--top-p", sampled[2]] if sampled[2] else [])
    section.fields(code(argv), machine_summary(report["machine"]), ["targets.md", "targets.json", "targets.png"])
    section.copy("targets.md")


READ_ME_STEPS = (  # readme.py's steps: (step, what it writes, the report that names its machine)
    ("sweep", "sweep/", "sweep/summary.md"),
    ("blocks", "sweep-blocks/", "sweep-blocks/summary.md"),
    ("anchor", "anchor/", "anchor/streamed/summary.md"),
    ("peer", "peer.md, peer.json", None),
)


def peer_machine(machine_md: Path) -> str | None:
    """The machine of the last readme.py run that had the peer step, from machine.md's log."""
    if not machine_md.is_file():
        return None
    found = None
    for line in machine_md.read_text().splitlines():
        m = re.match(r"(.+?), steps ([\w,]+)[^:]*: ([^;]+);", line)
        if m and "peer" in m[2].split(","):
            found = f"{m[3]} ({m[1]})"
    return found


def readme(section: Section) -> None:
    command = [PYTHON, "benchmarks/readme.py"]
    if not section.folder.is_dir() or not any(section.folder.iterdir()):
        section.absent(code(command))
        return
    section.fields(
        f"{code(command)} (every step; `--steps` runs some, and each step's latest run is kept: "
        "machine.md logs each run and its steps)",
        "each step's, in the table below",
        ["machine.md", "tables.md", "anchor/anchor.md", "peer.md"],
    )
    section.lines += ["| step | writes | reproduce | ran on |", "|---|---|---|---|"]
    for step, writes, report in READ_ME_STEPS:
        ran_on = peer_machine(section.folder / "machine.md") if report is None else machine_in(section.folder / report)
        section.lines.append(f"| {step} | {writes} | {code([*command, '--steps', step])} | {ran_on or 'no run'} |")
    section.lines.append("")
    section.copy("tables.md", "### The sweeps, condensed (tables.md)")
    for folder, title in (("sweep-blocks", "each arm alone on the server"), ("sweep", "the arms sharing the server")):
        figures = sorted(p.name for p in (section.folder / folder).glob("*.png"))
        if not figures:
            continue
        section.lines += [f"### {folder}/: {title}", ""]
        if "speedup.png" in figures:
            section.lines += [f"![speedup, {title}]({section.link}/{folder}/speedup.png)", ""]
        others = [f"[{Path(name).stem}]({section.link}/{folder}/{name})" for name in figures if name != "speedup.png"]
        reports = [f"[{n}]({section.link}/{folder}/{n})" for n in ("summary.md", "summary.csv")
                   if (section.folder / folder / n).is_file()]  # fmt: skip
        section.lines += [f"Figures: {', '.join(others)}; every cell: {', '.join(reports)}.", ""]
    section.copy("anchor/anchor.md", "### Against NVIDIA's tensorrt_llm_bls draft-target loop (anchor/anchor.md)")
    section.copy("peer.md", "### Against Hugging Face transformers in process (peer.md)")


def copy_bound_workloads(report: dict) -> list[str]:
    """The workloads a copy_bound run replayed, as its task rows name them: a workload of several
    task kinds has a row "NAME (all)"; the built-in chat prompts are kind "chat"."""
    kinds = [t["kind"] for t in report["tasks"]]
    return [
        k.removesuffix(" (all)") if k.endswith(" (all)") else k for k in kinds if k.endswith(" (all)") or k == "chat"
    ]


def copy_bound(section: Section) -> None:
    argv = [PYTHON, "benchmarks/copy_bound.py"]
    report_path = section.folder / "copy_bound.json"
    if not report_path.is_file():
        section.absent(code(argv))
        return
    workloads = copy_bound_workloads(json.loads(report_path.read_text()))
    if workloads and sorted(workloads) != ["chat", "grounded"]:
        argv += ["--workload", ",".join(workloads)]
    section.fields(code(argv), machine_in(section.folder / "copy_bound.md"), ["copy_bound.md", "copy_bound.json"])
    section.copy("copy_bound.md")


def crosscheck(section: Section) -> None:
    argv = [PYTHON, "benchmarks/crosscheck.py"]
    report_path = section.folder / "crosscheck.md"
    if not report_path.is_file():
        section.absent(code(argv))
        return
    m = re.match(r"(\d+) grounded prompts per arm, (\d+) tokens at most", report_path.read_text())
    if m and int(m[1]) != CROSSCHECK_DEFAULTS["requests"]:
        argv += ["--requests", m[1]]
    if m and int(m[2]) != CROSSCHECK_DEFAULTS["max_tokens"]:
        argv += ["--max-tokens", m[2]]
    section.fields(code(argv), machine_in(section.folder / "crosscheck-bench" / "summary.md"),
                   ["crosscheck.md", "crosscheck-bench/summary.md"])  # fmt: skip
    section.copy("crosscheck.md")


def draft_length(section: Section) -> None:
    argv = [PYTHON, "benchmarks/draft_length.py"]
    report_path = section.folder / "draft_length.json"
    if not report_path.is_file():
        section.absent(code(argv))
        return
    rows = json.loads(report_path.read_text())["rows"]
    given = {"lengths": ",".join(sorted({r["arm"].split(":")[1] for r in rows if ":" in r["arm"]}, key=int)),
             "num_requests": int(rows[0]["requests"]), "max_tokens": None}  # fmt: skip
    m = re.match(r"One user, (\d+) tokens at most", (section.folder / "draft_length.md").read_text())
    given["max_tokens"] = int(m[1]) if m else DRAFT_LENGTH_DEFAULTS["max_tokens"]
    for key, value in given.items():
        if value != DRAFT_LENGTH_DEFAULTS[key]:
            argv += [f"--{key.replace('_', '-')}", str(value)]
    section.fields(code(argv), machine_in(section.folder / "draft_length.md"), ["draft_length.md", "draft_length.json"])
    section.copy("draft_length.md")
    if (section.folder / "draft_length.png").is_file():
        section.lines += [f"![speedup by cap]({section.link}/draft_length.png)", ""]


def one_report(section: Section, script: str, header: str, defaults: dict[str, int]) -> None:
    """A benchmark whose run is one <script>.md, beginning with `header` (a pattern whose groups
    are the values of `defaults`' options, in order)."""
    argv = [PYTHON, f"benchmarks/{script}.py"]
    report_path = section.folder / f"{script}.md"
    if not report_path.is_file():
        section.absent(code(argv))
        return
    if m := re.match(header, report_path.read_text()):
        for (key, default), value in zip(defaults.items(), m.groups(), strict=True):
            if int(value) != default:
                argv += [f"--{key.replace('_', '-')}", value]
    section.fields(code(argv), machine_in(report_path), [f"{script}.md"])
    section.copy(f"{script}.md")


def edge_overhead(section: Section) -> None:
    one_report(section, "edge_overhead", r"(\d+) blocks x (\d+) requests, (\d+) at a time, (\d+) tokens each",
               EDGE_DEFAULTS)  # fmt: skip


def startup(section: Section) -> None:
    one_report(section, "startup", r"(\d+) rounds", STARTUP_DEFAULTS)


def soak(section: Section) -> None:
    argv = [PYTHON, "benchmarks/soak.py"]
    report_path = section.folder / "soak.json"
    if not report_path.is_file():
        section.absent(code(argv))
        return
    report = json.loads(report_path.read_text())
    argv += ["--requests", str(report["requests"]), "--concurrency", str(report["concurrency"])]
    memory = report["memory"]
    if report["max_tokens"] != SOAK_DEFAULTS["max_tokens"]:
        argv += ["--max-tokens", str(report["max_tokens"])]
    for flag, key in (("--warmup", "warmup_requests"), ("--sample-every", "sample_every"),
                      ("--max-slope", "max_slope_bytes_per_request")):  # fmt: skip
        if memory[key] != SOAK_DEFAULTS[key]:
            argv += [flag, f"{memory[key]:g}"]
    command = code(argv)
    skipped = report["outcomes"].get("skipped (time bound)")
    if skipped:
        command += f" with a time bound (`--max-seconds`, not in soak.json) that left {skipped} requests unsent"
    if "machine" in report:
        machine = machine_summary(report["machine"])
    else:  # a run from before soak.py stored its machine: the note beside it
        noted = machine_in(section.folder / "machine.md")
        machine = noted and f"{noted} (not in soak.json: recorded afterwards in machine.md)"
    section.fields(command, machine, ["soak.json", "soak.png", "machine.md"])
    outcomes = report["outcomes"]
    section.lines += ["| outcome | requests |", "|---|---|"]
    section.lines += [f"| {outcome} | {count} |" for outcome, count in sorted(outcomes.items())]
    section.lines += [
        "",
        f"{report['requests']} requests, {report['concurrency']} at a time; unexpected outcomes: "
        f"{len(report['unexpected'])}; KV cache slots in use at the end: {report['kv_slots_in_use_at_end']:.0f}.",
        "",
    ]
    section.lines += [
        f"Resident memory by process, in bytes a request: the least-squares slope over the samples after "
        f"warm-up ({memory['warmup_requests']} requests, a sample every {memory['sample_every']}), "
        f"at most {memory['max_slope_bytes_per_request']:.0f} in any process "
        f"({'met' if not report.get('failures') else 'not met: ' + '; '.join(report['failures'])}).",
        "",
        "| process | rss | anon | file | shmem |",
        "|---|---|---|---|---|",
    ]
    kinds = ("rss", "anon", "file", "shmem")
    section.lines += [
        f"| {name} | {' | '.join(f'{slopes[k]:+.0f}' for k in kinds)} |"
        for name, slopes in sorted(memory["slopes_bytes_per_request"].items())
    ]
    section.lines.append("")
    if (section.folder / "soak.png").is_file():
        section.lines += [f"![resident memory by process]({section.link}/soak.png)", ""]


def gpu_check(section: Section) -> None:
    argv = ["python3", "benchmarks/gpu_check.py"]
    report_path = section.folder / "gpu_check.json"
    if not report_path.is_file():
        section.absent(f"{code(argv)} on a machine with one GPU")
        return
    report = json.loads(report_path.read_text())
    if report["device"] == "cpu":
        argv += ["--device", "cpu"]
    cost = report["verification_cost"]
    if cost["rows"] == [1, 2, 4, 8]:
        argv += ["--quick"]
    section.fields(code(argv), f"{machine_summary(report['machine'])}; device {report['device']}", ["gpu_check.json"])
    exactness = report["exactness"]
    exact = sum(c["exact"] for c in exactness["checks"])
    section.lines += [
        f"PyTorch {report['torch']}, {report['dtype']}, a model of {report['model']['shape']['num_hidden_layers']} "
        f"layers with {report['model']['weights']} weights and a draft of its first {report['model']['draft_layers']}; "
        f"{report['seconds']:.0f} s in all. Exactness: {exact} of {len(exactness['checks'])} (proposer, draft length) "
        f"checks give plain decoding's tokens{'' if exactness['all_exact'] else ': **not all exact**'}.",
        "",
        "| rows | forward ms | against one row |",
        "|---|---|---|",
    ]
    section.lines += [
        f"| {rows} | {seconds * 1e3:.2f} | {relative:.2f}x |"
        for rows, seconds, relative in zip(cost["rows"], cost["seconds"], cost["relative_to_one_row"], strict=True)
    ]
    section.lines += ["", "| requests at once | proposer | tokens/s | acceptance | speedup |", "|---|---|---|---|---|"]
    for t in report["throughput"]:
        speedup = f"{t['speedup']:.2f}x" if "speedup" in t else "-"
        section.lines.append(
            f"| {t['requests']} | {t['proposer']} | {t['tokens_per_s']:.1f} | {t['acceptance']:.0%} | {speedup} |"
        )
    section.lines.append("")


SECTIONS: tuple[tuple[str, str, Callable[[Section], None]], ...] = (
    ("targets", "Targets: the four speed figures", targets),
    ("readme", "The README's measurements: sweeps, the anchor, the peer comparison", readme),
    ("copy_bound", "Copy bound: how far prompt lookup can go", copy_bound),
    ("crosscheck", "Crosscheck: the load generator against curl", crosscheck),
    ("soak", "Soak", soak),
    ("draft_length", "Draft length: the default cap on drafts", draft_length),
    ("edge_overhead", "Edge overhead: what the server's edge costs", edge_overhead),
    ("startup", "Start-up: time to ready, calibrating or reusing the calibration", startup),
    ("gpu_check", "GPU check", gpu_check),
)


def render(results: Path = RESULTS, doc: Path = DOC) -> str:
    """The document for the results in `results`, its links relative to `doc`'s folder."""
    link = Path(os.path.relpath(results, doc.parent)).as_posix()
    parts = [
        "# Performance",
        "",
        "Generated by `benchmarks/performance.py` from the latest run of each benchmark in "
        f"[benchmarks/results/]({link}/) (one folder per benchmark script, each overwritten by its next run); "
        "every benchmark script rewrites this file at its end. Do not edit it by hand: run "
        f"`{PYTHON} benchmarks/performance.py`.",
        "",
    ]
    for script, title, fill in SECTIONS:
        section = Section(script, title, results, link)
        fill(section)
        parts.append(section.text())
    return "\n".join(parts).rstrip("\n") + "\n"


def write(results: Path = RESULTS, doc: Path = DOC) -> Path:
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(render(results, doc))
    return doc


def publish(lines: list[str], out: Path) -> None:
    """A one-file report: printed, written to `out` (its folder made), and the document updated."""
    report = "\n".join(lines) + "\n"
    print(report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    update(out.parent)


def update(out: Path) -> None:
    """Regenerate docs/performance.md when `out`, where a benchmark just wrote, is in this tree's
    results (not a run into a folder of its own)."""
    out = Path(out).resolve()
    if out == RESULTS or RESULTS in out.parents:
        write()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 where the document differs from the results")
    args = ap.parse_args(argv)
    if args.check:
        same = DOC.is_file() and DOC.read_text() == render()
        print(f"{DOC}: {'current' if same else 'differs from the results: run benchmarks/performance.py'}")
        return 0 if same else 1
    print(f"wrote {write()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
