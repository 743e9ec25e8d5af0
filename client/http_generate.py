"""Generate through the ensemble over HTTP with nothing but Python's standard library: Triton's
`generate` endpoint (one JSON answer) or `generate_stream` (server-sent events), as curl would.

    python client/http_generate.py "Summarize: ..." [--url 127.0.0.1:8000] [--stream] [--max-tokens 128]

The same with curl:
    curl -s 127.0.0.1:8000/v2/models/ensemble/generate -d '{"text_input": "Hello", "max_tokens": 32}'
    curl -sN 127.0.0.1:8000/v2/models/ensemble/generate_stream \\
        -d '{"text_input": "Hello", "max_tokens": 32, "stream": true}'
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Generate through the ensemble over HTTP.")
    ap.add_argument("prompt")
    ap.add_argument("--url", default="127.0.0.1:8000")
    ap.add_argument("--stream", action="store_true", help="server-sent events, the text as it is generated")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float)
    ap.add_argument("--seed", type=int)
    args = ap.parse_args(argv)

    body = {"text_input": args.prompt, "max_tokens": args.max_tokens, "stream": args.stream}
    body |= {k: v for k, v in (("temperature", args.temperature), ("seed", args.seed)) if v is not None}
    endpoint = "generate_stream" if args.stream else "generate"
    request = urllib.request.Request(f"http://{args.url}/v2/models/ensemble/{endpoint}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            if not args.stream:
                answer = json.loads(response.read())
                print(answer["text_output"])
                last = answer
            else:
                last = None
                for line in response:
                    line = line.decode().strip()
                    if line.startswith("data:"):
                        last = json.loads(line[5:])
                        print(last["text_output"], end="", flush=True)
                print()
    except urllib.error.HTTPError as err:  # a refused request: 400 with the field named
        print(f"error {err.code}: {err.read().decode()}", file=sys.stderr)
        return 1
    if last:
        print(f"[{last['num_output_tokens']} tokens; {last['total_draft_tokens']} drafted, "
              f"{last['total_accepted_draft_tokens']} accepted]")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
