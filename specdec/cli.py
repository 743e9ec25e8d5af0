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


def cmd_build(args: argparse.Namespace) -> int:
    from specdec.build import build

    repo = build(load_profile(args.profile))
    console.print(f"[green]built[/] model repository: {repo}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from specdec.build import build
    from specdec.serve import Ports, TritonServer

    profile = load_profile(args.profile)
    s = profile.server
    host = args.host or s.host
    if host not in ("127.0.0.1", "localhost", "::1"):
        console.print(f"[yellow]warning:[/] serving on {host}: reachable from other machines (no authentication)")
    ports = Ports(args.http_port or s.http_port, args.grpc_port or s.grpc_port, args.metrics_port or s.metrics_port)
    if not args.no_build:
        build(profile)
    server = TritonServer(profile, host=host, ports=ports)
    stopping = False

    def stop(signum, frame) -> None:
        nonlocal stopping
        stopping = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    server.start(foreground_log=args.verbose)
    try:
        with console.status("loading models..."):
            server.wait_ready()
        console.print(
            f"[green]ready[/]  gRPC {server.grpc_url}  HTTP {server.http_url}  metrics {server.metrics_url}\n"
            f"log: {server.log_file if not args.verbose else '(this terminal)'}   Ctrl-C stops"
        )
        while server.process is not None and server.process.poll() is None:
            server.process.wait(timeout=None)
        if not stopping:
            console.print(f"[red]tritonserver exited[/] ({server.process.returncode if server.process else '?'})")
            console.print(server.log_tail())
            return 1
    except KeyboardInterrupt:
        console.print("stopping...")
    finally:
        server.stop()
    return 0


def _params(args: argparse.Namespace):
    from specdec.client.client import GenerationParams

    return GenerationParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        num_draft_tokens=args.num_draft_tokens,
        draft_method=args.draft_method,
        stop_words=args.stop or None,
    )


def cmd_generate(args: argparse.Namespace) -> int:
    from specdec.client.client import TritonClient
    from specdec.serve import embedded_server

    profile = load_profile(args.profile)

    def show(text: str) -> None:
        console.print(text, end="", markup=False, highlight=False, soft_wrap=True)

    async def main(url: str):
        async with TritonClient(url) as client:
            return await client.generate(
                args.prompt, _params(args), stream=args.stream, on_chunk=show if args.stream else None
            )

    with embedded_server(profile, args.url) as (grpc_url, _, _):
        record = asyncio.run(main(grpc_url))
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
    from specdec.demo import run_demo

    return run_demo(load_profile(args.profile), url=args.url, max_tokens=args.max_tokens)


def _add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--num-draft-tokens", type=int, help="0 turns speculation off; default: the profile's")
    p.add_argument("--draft-method", choices=["draft_model", "ngram", "none"])
    p.add_argument("--stop", action="append", help="stop word (repeatable)")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="specdec", description="Speculative decoding on Triton Inference Server")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("build", help="convert weights / build engines and render the model repository")
    _add_profile(p)
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("serve", help="run tritonserver in the foreground (Ctrl-C or SIGTERM stops it)")
    _add_profile(p)
    p.add_argument("--host", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--http-port", type=int)
    p.add_argument("--grpc-port", type=int)
    p.add_argument("--metrics-port", type=int)
    p.add_argument("--no-build", action="store_true", help="serve what was built, do not check the build")
    p.add_argument("--verbose", action="store_true", help="server log to this terminal")
    p.set_defaults(func=cmd_serve)

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
