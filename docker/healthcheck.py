"""Docker HEALTHCHECK: healthy once Triton reports every model ready (/v2/health/ready)."""

import os
import sys
import urllib.request

port = os.environ.get("SPECDEC_HTTP_PORT", "8000")
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=4) as response:
        sys.exit(0 if response.status == 200 else 1)
except OSError:
    sys.exit(1)
