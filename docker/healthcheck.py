"""Probes of a served profile, for Docker's HEALTHCHECK and Kubernetes:

    python3 docker/healthcheck.py [--ready]    ready: `specdec serve` reports every model's stub alive and no drain
                                              (its state file, renewed every few seconds) and Triton answers
                                              /v2/health/ready; Triton's own endpoint stays 200 with a dead stub
    python3 docker/healthcheck.py --live       alive: `specdec serve` is supervising (starting or restarting within
                                              its ready_timeout_s, else its state renewed lately)

Exit 0: yes; 1: no. The profile is $SPECDEC_PROFILE (default configs/embedded.yaml), the port
$SPECDEC_HTTP_PORT (default the profile's)."""

import os
import sys
import urllib.request
from pathlib import Path

from specdec.config import load_profile
from specdec.triton.serve import DRAINING, READY, RESTARTING, STARTING, read_state

STALE_S = 30.0  # a state older than this: the supervisor is gone or stuck


def ready(profile, port: str) -> bool:
    state, age = read_state(profile)
    if state != READY or age > STALE_S:
        return False
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=4) as response:
            return response.status == 200
    except OSError:
        return False


def alive(profile) -> bool:
    state, age = read_state(profile)
    if state in (STARTING, RESTARTING):
        return age <= profile.server.ready_timeout_s + STALE_S
    return state in (READY, DRAINING) and age <= STALE_S


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parent.parent
    profile = load_profile(os.environ.get("SPECDEC_PROFILE") or root / "configs" / "embedded.yaml")
    port = os.environ.get("SPECDEC_HTTP_PORT") or str(profile.server.http_port)
    return 0 if (alive(profile) if "--live" in argv else ready(profile, port)) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
