"""The `specdec` command: a thin layer of argument parsing over the library."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from specdec.config import DEFAULT_PROFILE, ProfileError, load_profile
from specdec.progress import console


def _add_profile(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", help=f"deployment profile (YAML); default: {DEFAULT_PROFILE.name}")


def _add_url(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="gRPC address of a running server (host:port); default: start the profile's server")
    _add_access(p)


def _add_access(p: argparse.ArgumentParser) -> None:
    """How a client reaches a --url server with gRPC TLS or restricted APIs (the profile's own
    server is reached as its server.tls and server.restricted_apis say)."""
    p.add_argument("--ssl-root-cert", metavar="PEM", help="with --url: gRPC over TLS, trusting this certificate")
    p.add_argument("--ssl-cert", metavar="PEM", help="with --url, mutual TLS: this client's certificate")
    p.add_argument("--ssl-key", metavar="PEM", help="with --url, mutual TLS: its private key")
    p.add_argument("--header", action="append", metavar="NAME=VALUE", help="with --url: send this header with "
                   "every request (repeatable); a restricted gRPC API's is triton-grpc-protocol-<key>")  # fmt: skip


def _access(args: argparse.Namespace, profile, protocol: str = "grpc"):
    """The client's Access: from --ssl-* and --header for a --url server, else the profile's own."""
    from specdec.client.client import Access

    if not args.url:
        from specdec.triton.server_flags import client_headers, client_tls

        return Access(**client_tls(profile.server), headers=tuple(client_headers(profile.server, protocol).items()))
    headers = []
    for header in args.header or []:
        name, sep, value = header.partition("=")
        if not sep or not name.strip():
            raise SystemExit(f"--header {name!r}: give NAME=VALUE")
        headers.append((name.strip().lower(), value))  # gRPC metadata names are lower case
    return Access(bool(args.ssl_root_cert), args.ssl_root_cert, args.ssl_cert, args.ssl_key, headers=tuple(headers))


def cmd_build(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specdec.build import build
    from specdec.build.trtllm import BuildError

    if args.output_dir and not args.render_only:
        console.print("[red]error:[/] --output-dir goes with --render-only")
        return 2
    if args.script:
        from specdec.build.scripts import build_script

        print(build_script(load_profile(args.profile), Path(args.profile or DEFAULT_PROFILE)), end="")
        return 0
    output_dir = Path(args.output_dir).resolve() if args.output_dir else None
    try:
        repo = build(load_profile(args.profile), args.dry_run, args.render_only, output_dir)
    except BuildError as err:
        console.print(f"[red]build failed:[/] {err}")
        return 1
    if args.render_only:
        console.print(f"[green]rendered[/] model repository (nothing built): {repo}")
    elif not args.dry_run:
        console.print(f"[green]built[/] model repository: {repo}")
    return 0


def cmd_train_guess_head(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specdec.build import build
    from specdec.build.guess_head import TrainOptions, train_guess_head

    profile = load_profile(args.profile)
    if profile.backend != "pytorch":
        console.print("[red]train-guess-head:[/] the guess head is the PyTorch engine's (backend: pytorch)")
        return 2
    ngram = profile.speculation.ngram
    out = Path(args.out or ngram.guess_head or "guess-head.safetensors")
    phrases = Path(args.phrases or ngram.phrases or out.with_name("phrases.safetensors"))
    ngram = ngram.model_copy(update={"guess_head": None, "phrases": None})  # (the files to be)
    profile = profile.model_copy(update={"speculation": profile.speculation.model_copy(update={"ngram": ngram})})
    build(profile)
    train_guess_head(profile, out, phrases, TrainOptions(epochs=args.epochs))
    console.print(f"[green]wrote[/] {out} and {phrases}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from specdec.build import build
    from specdec.triton.serve import STARTING, STOPPED, Ports, ServerError, TritonServer, supervise, write_state

    profile = load_profile(args.profile)
    s = profile.server
    host = args.host or s.host
    if host not in ("127.0.0.1", "localhost", "::1"):
        console.print(f"[yellow]warning:[/] serving on {host}: reachable from other machines (no authentication)")
    openai = s.openai_port if args.openai_port is None else args.openai_port
    ports = Ports(args.http_port or s.http_port, args.grpc_port or s.grpc_port, args.metrics_port or s.metrics_port,
                  openai)  # fmt: skip
    if not args.no_build:
        build(profile)
    server = TritonServer(profile, host=host, ports=ports)
    server.supervised = True
    write_state(profile, STARTING)

    def stop(signum, frame) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        server.start(foreground_log=args.verbose)
        with console.status("loading models..."):
            server.wait_ready()
        console.print(
            f"[green]ready[/]  gRPC {server.grpc_url}  HTTP {server.http_url}  metrics {server.metrics_url}"
            + (f"  OpenAI {server.openai_url}" if server.openai_url else "")
            + "\n"
            f"log: {server.log_file if not args.verbose else '(this terminal)'}   Ctrl-C stops"
        )
        return supervise(server, console.print)
    except KeyboardInterrupt:
        console.print("stopping...")
    except ServerError as err:
        console.print(f"[red]error:[/] {err}")
        return 1
    finally:
        server.stop()
        write_state(profile, STOPPED)
    return 0


def cmd_replicas(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from rich.markup import escape

    from specdec.triton.replicas import BalancerPorts, Cluster
    from specdec.triton.serve import ServerError

    profile = load_profile(args.profile)
    ports = BalancerPorts.of(profile)
    ports = BalancerPorts(args.http_port or ports.http, args.grpc_port or ports.grpc, args.openai_port or ports.openai,
                          args.stats_port or ports.stats)  # fmt: skip
    host = args.host or profile.server.host
    if host not in ("127.0.0.1", "localhost", "::1"):
        console.print(f"[yellow]warning:[/] the balancer listens on {host}: reachable from other machines")
    cluster = Cluster(profile, args.replicas, host, ports)

    def stop(signum, frame) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        if not args.no_build:
            cluster.build()
        with console.status(f"starting {args.replicas} replicas and haproxy (models load and warm up)..."):
            cluster.start()
            info = cluster.wait_ready()
        console.print(f"[green]ready[/]: {args.replicas} replicas behind haproxy {info.haproxy_version}\n"
                      f"  gRPC {info.grpc_url}  HTTP {info.http_url}  OpenAI {info.openai_url}  "
                      f"stats {info.stats_url} (Prometheus: {info.stats_url}metrics)")  # fmt: skip
        for r in info.replicas:
            console.print(f"  {r.name}: gRPC {r.grpc_url}  metrics {r.metrics_url}  log {Path(r.build_dir) / 'logs'}")
        if args.failover_demo:
            from specdec.client.failover import run_failover

            output_dir = Path(args.output_dir or f"bench-out/failover-{time.strftime('%Y%m%d-%H%M%S')}")
            return 0 if run_failover(info, profile, output_dir, requests=args.requests).passed else 1
        console.print(f"{cluster.info_path} describes it   Ctrl-C stops")
        return cluster.watch(console.print)
    except KeyboardInterrupt:
        pass
    except ServerError as err:
        console.print("[red]error:[/]", escape(str(err)))
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C would leave processes behind
        with console.status("stopping: the replicas drain (up to 15 s), then haproxy..."):
            cluster.stop()
        console.print("stopped")
    return 0


def _params(args: argparse.Namespace):
    from specdec.client.client import RequestParams

    return RequestParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        num_draft_tokens=args.num_draft_tokens,
        draft_method=args.draft_method,
        stop_words=args.stop or None,
        cache_salt=args.cache_salt,
    )


def cmd_generate(args: argparse.Namespace) -> int:
    import grpc
    from tritonclient.utils import InferenceServerException

    from specdec.client.client import TritonClient
    from specdec.triton.serve import embedded_server

    profile = load_profile(args.profile)

    def show(text: str) -> None:
        console.print(text, end="", markup=False, highlight=False, soft_wrap=True)

    async def main(url: str):
        async with TritonClient(url, _access(args, profile)) as client:
            return await client.generate(
                args.prompt, _params(args), stream=args.stream, on_chunk=show if args.stream else None
            )

    with embedded_server(profile, args.url) as (grpc_url, _, _):
        try:
            record = asyncio.run(main(grpc_url))
        except (grpc.RpcError, InferenceServerException) as err:  # unreachable, or refused (TLS, an API key)
            details = err.details() if isinstance(err, grpc.RpcError) else err.message()
            console.print(f"[red]error:[/] {details}")
            return 1
    if record.error:
        console.print(f"[red]error:[/] {record.error}")
        return 1
    if not args.stream:
        show(record.text)
    console.print()
    seconds = record.end - record.start
    console.print(
        f"[dim]{record.num_output_tokens} tokens in {seconds:.2f} s "
        f"({record.num_output_tokens / seconds:.1f} tokens/s), "
        f"acceptance {record.acceptance_rate:.0%} of {record.total_draft_tokens} draft tokens, "
        f"mean accepted length {record.mean_accepted_length:.2f}[/]"
    )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from specdec.client.demo import run_demo

    profile = load_profile(args.profile)
    return run_demo(profile, url=args.url, max_tokens=args.max_tokens, access=_access(args, profile))


def cmd_check(args: argparse.Namespace) -> int:
    from specdec.client import commands
    from specdec.client.check import TOKEN_EXACT_WHEN_SAMPLED, CheckArm, Sampled, sampled_check_error
    from specdec.client.loadgen import parse_counts

    profile = load_profile(args.profile)
    proposers = (
        args.proposers.split(",") if args.proposers else [a.draft_method for a in commands.default_arms(profile)[1:]]
    )
    arms = [CheckArm(p, k) for p in proposers for k in parse_counts(args.num_draft_tokens)]
    sampled = None
    if args.temperature:
        sampled = Sampled(args.temperature, args.top_p, args.seed)
        if not args.proposers:  # the profile's proposers: those a sampled check can compare
            arms = [a for a in arms if a.proposer in TOKEN_EXACT_WHEN_SAMPLED]
        if error := sampled_check_error(arms):
            raise SystemExit(f"specdec check: {error}")
    return commands.check(profile, args.url, arms, args.workload, args.num_prompts, args.max_tokens, args.concurrency,
                          sampled, _access(args, profile))  # fmt: skip


def bench_config(args: argparse.Namespace, profile):
    """The BenchConfig of `specdec bench`'s arguments (ValueError: one does not parse)."""
    from specdec.client import commands
    from specdec.client.loadgen import BenchConfig, Load, parse_arm, parse_counts, parse_slo
    from specdec.client.workloads import WorkloadOptions

    arms = [parse_arm(a) for a in args.arms.split(",")] if args.arms else commands.default_arms(profile)
    workloads = tuple(args.workload.split(","))
    if args.input_tokens is not None and "synthetic" not in workloads:  # genai-perf's prompts are synthetic
        console.print("[yellow]warning:[/] --input-tokens (--isl) sets the length of the synthetic workload's "
                      "prompts, and the run has none: add --workload synthetic")  # fmt: skip
    loads = [Load(concurrency=c) for c in parse_counts(args.concurrency)] if args.concurrency else []
    loads += [Load(rate=float(r)) for r in args.request_rate.split(",")] if args.request_rate else []
    return BenchConfig(
        arms=tuple(arms),
        loads=tuple(loads or [Load(concurrency=1)]),
        workloads=workloads,
        # a duration alone bounds a level by time; the count stays bounded all the same
        num_requests=args.num_requests or (100_000 if args.duration else 16),
        duration=args.duration or 1800.0,
        warmup=args.warmup,
        request_timeout=args.request_timeout,
        interleave=args.interleave,
        transport=args.transport,
        stream=not args.no_stream,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        slo=parse_slo(args.goodput or []),
        workload_options=WorkloadOptions(
            args.max_tokens,
            256 if args.input_tokens is None else args.input_tokens,
            args.input_tokens_stddev,
            args.seed,
        ),
    )


def cmd_bench(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from specdec.client import commands

    profile = load_profile(args.profile)
    try:
        config = bench_config(args, profile)
    except ValueError as err:
        console.print(f"[red]error:[/] {err}")
        return 2
    output_dir = Path(args.output_dir or f"bench-out/{time.strftime('%Y%m%d-%H%M%S')}")
    access = _access(args, profile, "http" if args.transport == "http" else "grpc")
    return commands.bench(profile, args.url, config, output_dir, args.metrics_url, args.server_pid, not args.no_plots,
                          access)  # fmt: skip


def _add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--num-draft-tokens", type=int, help="0 turns speculation off; default: the profile's")
    p.add_argument("--draft-method", choices=["draft_model", "ngram", "none"])
    p.add_argument("--stop", action="append", help="stop word (repeatable)")
    p.add_argument("--cache-salt", help="reuse cached prefixes only of requests with this salt")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="specdec", description="Speculative decoding on Triton Inference Server")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("build", help="convert weights / build engines and render the model repository")
    _add_profile(p)
    p.add_argument("--dry-run", action="store_true", help="print the commands that would run; write nothing")
    p.add_argument(
        "--render-only", action="store_true", help="write only the model repository a build would serve (no engines)"
    )
    p.add_argument("--output-dir", help="with --render-only: where the repository goes (default: the build's)")
    p.add_argument("--script", action="store_true", help="print the build as a bash script (build_scripts/)")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser(
        "train-guess-head",
        help="train the target's guess head on its own outputs and write their phrase index (25-45 min on 2 cores)",
    )
    _add_profile(p)
    p.add_argument("--out", help="default: the profile's speculation.ngram.guess_head")
    p.add_argument("--phrases", help="default: the profile's speculation.ngram.phrases")
    p.add_argument("--epochs", type=int, default=3)
    p.set_defaults(func=cmd_train_guess_head)

    p = sub.add_parser("serve", help="run tritonserver in the foreground (Ctrl-C or SIGTERM stops it)")
    _add_profile(p)
    p.add_argument("--host", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--http-port", type=int)
    p.add_argument("--grpc-port", type=int)
    p.add_argument("--metrics-port", type=int)
    p.add_argument("--openai-port", type=int, help="the OpenAI-compatible API's port (0: none; default: the profile's)")
    p.add_argument("--no-build", action="store_true", help="serve what was built, do not check the build")
    p.add_argument("--verbose", action="store_true", help="server log to this terminal")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("replicas", help="replicas of the profile behind haproxy on this machine: routing, "
                       "readiness checks, failover (Ctrl-C stops them all)")  # fmt: skip
    _add_profile(p)
    p.add_argument("--replicas", type=int, default=2, help="how many (default 2)")
    p.add_argument("--host", help="the balancer's address (default the profile's, 127.0.0.1); replicas: 127.0.0.1")
    p.add_argument("--http-port", type=int, help="the balancer's Triton HTTP port (default the profile's)")
    p.add_argument("--grpc-port", type=int, help="its Triton gRPC port (default the profile's)")
    p.add_argument("--openai-port", type=int, help="its OpenAI-compatible API port (default the profile's, or 9000)")
    p.add_argument("--stats-port", type=int, help="haproxy's stats page and Prometheus /metrics (default 8404)")
    p.add_argument("--no-build", action="store_true", help="serve what was built, do not check the build")
    p.add_argument("--failover-demo", action="store_true",
                   help="once ready, run a bench through the balancer, kill one replica's tritonserver in the "
                   "middle of it, report what clients saw, and stop")  # fmt: skip
    p.add_argument("--requests", type=int, default=40, help="--failover-demo's bench requests (default 40)")
    p.add_argument("--output-dir", help="--failover-demo's reports (default bench-out/failover-<date-time>)")
    p.set_defaults(func=cmd_replicas)

    p = sub.add_parser("generate", help="generate from a prompt")
    p.add_argument("prompt")
    _add_profile(p)
    _add_url(p)
    _add_sampling(p)
    p.add_argument("--stream", action="store_true", help="print tokens as they arrive")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("demo", help="speculative vs plain decoding of one prompt, with acceptance and speedup")
    _add_profile(p)
    _add_url(p)
    p.add_argument("--max-tokens", type=int, default=160)
    p.set_defaults(func=cmd_demo)

    workloads = "grounded, chat, mixed, synthetic, or a genai-perf .jsonl file"
    p = sub.add_parser("check", help="speculation against plain decoding: report any token that differs")
    _add_profile(p)
    _add_url(p)
    p.add_argument("--proposers", help="comma-separated (ngram,draft_model); default: those the profile has")
    p.add_argument("--num-draft-tokens", default="1,4,8", help="draft lengths to check (default 1,4,8)")
    p.add_argument("--workload", default="mixed", help=f"prompt set: {workloads} (default mixed)")
    p.add_argument("--num-prompts", type=int, default=12)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight, mixed across arms")
    p.add_argument("--temperature", type=float, help="sample (prompt lookup only); default: greedy")
    p.add_argument("--top-p", type=float)
    p.add_argument("--seed", type=int, default=0, help="prompt i samples with seed + i in every arm")
    p.set_defaults(func=cmd_check)

    # Flags of genai-perf (`genai-perf profile`) and of `vllm bench serve` are accepted as aliases
    # of ours (docs/load-generator.md); where their counts are of a whole run, ours are per arm
    # and level, the same in a run of one arm at one level.
    p = sub.add_parser("bench", help="load generator: speculation against the baseline across load levels")
    _add_profile(p)
    p.add_argument("--url", help="address of a running server for --transport (gRPC host:8001, HTTP host:8000, "
                   "OpenAI host:9000); default: start the profile's server for the run")  # fmt: skip
    _add_access(p)
    p.add_argument(
        "--metrics-url", help="its Prometheus endpoint (default: the --url host, the profile's metrics port)"
    )
    p.add_argument("--server-pid", type=int, help="its process, for memory (default: the one listening on --url)")
    p.add_argument("--transport", choices=["grpc", "http", "openai"], default="grpc",
                   help="the ensemble over gRPC or HTTP, or the OpenAI-compatible API (chat; completions "
                   "for prompts without the chat template)")  # fmt: skip
    p.add_argument("--arms", help="comma-separated: baseline, ngram[:K], draft_model[:K] (default: the baseline, "
                   "the profile's proposer and the draft model)")  # fmt: skip
    p.add_argument("--concurrency", "--max-concurrency", dest="concurrency",
                   help="closed-loop levels: 1,2,4 or 1..16 (powers of two); default 1 "
                   "(--max-concurrency: vllm bench serve's name)")  # fmt: skip
    p.add_argument("--request-rate", help="open-loop levels, requests/s over all arms (Poisson arrivals): 0.5,1")
    p.add_argument("--num-requests", "--request-count", "--num-prompts", dest="num_requests", type=int,
                   help="requests per arm and level (default 16; 100000 with --duration); --request-count is "
                   "genai-perf's name, --num-prompts vllm bench serve's (requests sent; not genai-perf's "
                   "--num-prompts, its count of distinct prompts: ours are the workload's)")  # fmt: skip
    p.add_argument("--duration", type=float, help="seconds per level at most (default 1800)")
    p.add_argument("--warmup", "--warmup-request-count", dest="warmup", type=int, default=2,
                   help="unrecorded requests per arm before the first level (default 2)")  # fmt: skip
    p.add_argument("--request-timeout", type=float, default=300.0, help="seconds")
    p.add_argument("--interleave", choices=["block", "request"], default="block",
                   help="arms take turns in blocks, each alone on the server (default), or request by request, "
                   "sharing it")  # fmt: skip
    p.add_argument("--workload", "--input-file", dest="workload", default="mixed",
                   help=f"comma-separated: {workloads} (default mixed); --input-file FILE.jsonl: genai-perf's "
                   "name for a file of prompts")  # fmt: skip
    p.add_argument("--max-tokens", "--output-tokens-mean", "--osl", dest="max_tokens", type=int, default=128,
                   help="output tokens at most (synthetic: exactly); default 128")  # fmt: skip
    p.add_argument("--input-tokens", "--synthetic-input-tokens-mean", "--isl", dest="input_tokens", type=int,
                   help="the synthetic workload's prompt length, tokens (default 256)")  # fmt: skip
    p.add_argument("--input-tokens-stddev", "--synthetic-input-tokens-stddev", dest="input_tokens_stddev",
                   type=float, default=0.0)  # fmt: skip
    p.add_argument("--temperature", type=float, help="default: greedy")
    p.add_argument("--top-p", type=float, help="nucleus cut when sampling (default: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--goodput", nargs="+", metavar="SLO",
                   help="SLOs in ms: ttft:500 tpot:50 e2el:10000 (vllm bench serve's names) or "
                   "time_to_first_token:500 inter_token_latency:50 request_latency:10000")  # fmt: skip
    p.add_argument("--no-stream", action="store_true", help="one response per request (TTFT = request latency)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--output-dir", help="default: bench-out/<date-time>")
    p.set_defaults(func=cmd_bench)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except ProfileError as err:
        console.print(f"[red]profile error:[/] {err}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
