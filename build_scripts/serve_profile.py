"""Serve a built profile the way its backend needs; the last step of docker/entrypoint.sh.

backend pytorch      `specdec serve --no-build` (the container's tritonserver, else the wheel's)
backend tensorrtllm  tritonserver under `mpirun -n 1`; with tensorrtllm-backend engines in
                     TensorRT-LLM's orchestrator mode, which spawns each engine's tp*pp ranks

python build_scripts/serve_profile.py --profile FILE [--host H] [--http-port P] ... [--print]
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from specdec.config import load_profile
from specdec.serve import CONTAINER_SERVER, Ports, TritonServer, find_triton


def command(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    profile = load_profile(args.profile)
    s = profile.server
    host = args.host or s.host
    ports = Ports(args.http_port or s.http_port, args.grpc_port or s.grpc_port, args.metrics_port or s.metrics_port)
    if profile.backend != "tensorrtllm":
        argv = [sys.executable, "-m", "specdec.cli", "serve", "--profile", args.profile, "--no-build", "--host", host]
        argv += ["--http-port", str(ports.http), "--grpc-port", str(ports.grpc), "--metrics-port", str(ports.metrics)]
        return argv, dict(os.environ)
    from specdec.build.trtllm import TRITON_IMAGE, launch_command

    if not (CONTAINER_SERVER / "bin" / "tritonserver").is_file():
        sys.exit(f"{profile.name}: backend tensorrtllm needs NVIDIA's Triton container ({TRITON_IMAGE})")
    server = TritonServer(profile, host=host, ports=ports)
    install = find_triton(profile.build_path())
    return launch_command(profile, server.command(install), server.environment(install))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--host")
    ap.add_argument("--http-port", type=int)
    ap.add_argument("--grpc-port", type=int)
    ap.add_argument("--metrics-port", type=int)
    ap.add_argument("--print", action="store_true", help="print the command instead of running it")
    args = ap.parse_args(argv)
    cmd, env = command(args)
    if args.print:
        print(shlex.join(cmd))
        return
    os.execvpe(cmd[0], cmd, env)


if __name__ == "__main__":
    main()
