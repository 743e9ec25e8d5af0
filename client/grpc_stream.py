"""Stream a generation from the ensemble over gRPC with tritonclient: the text as it arrives, then
the request's speculation figures. Needs only `pip install tritonclient[grpc] numpy`.

    python client/grpc_stream.py "Summarize: ..." [--url 127.0.0.1:8001] [--max-tokens 128]
                                 [--temperature 0.7 --seed 1] [--num-draft-tokens 4]
"""

from __future__ import annotations

import argparse
import queue
import sys

import numpy as np
import tritonclient.grpc as grpcclient


def tensor(name: str, value, dtype) -> grpcclient.InferInput:
    data = np.array([[value]], dtype=dtype)
    out = grpcclient.InferInput(
        name, list(data.shape), "BYTES" if dtype is object else grpcclient.np_to_triton_dtype(dtype)
    )
    out.set_data_from_numpy(data)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Stream a generation from the ensemble over gRPC.")
    ap.add_argument("prompt")
    ap.add_argument("--url", default="127.0.0.1:8001")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--num-draft-tokens", type=int, help="0 turns speculation off for this request")
    args = ap.parse_args(argv)

    inputs = [tensor("text_input", args.prompt.encode(), object), tensor("max_tokens", args.max_tokens, np.int32),
              tensor("stream", True, bool)]  # fmt: skip
    if args.temperature is not None:
        inputs.append(tensor("temperature", args.temperature, np.float32))
    if args.seed is not None:
        inputs.append(tensor("seed", args.seed, np.uint64))
    if args.num_draft_tokens is not None:
        inputs.append(tensor("num_draft_tokens", args.num_draft_tokens, np.int32))
    outputs = ["text_output", "num_output_tokens", "total_draft_tokens", "total_accepted_draft_tokens"]

    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(args.url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer("ensemble", inputs, outputs=[grpcclient.InferRequestedOutput(n) for n in outputs],
                              enable_empty_final_response=True)  # fmt: skip
    last = None
    while True:
        result, error = responses.get()
        if error is not None:
            print(f"\nerror: {error}", file=sys.stderr)
            client.stop_stream()
            return 1
        final = result.get_response().parameters["triton_final_response"].bool_param
        if result.as_numpy("text_output") is not None:
            print(result.as_numpy("text_output").reshape(-1)[0].decode(), end="", flush=True)
            last = result
        if final:
            break
    client.stop_stream()
    if last is not None:
        tokens, drafted, accepted = (int(last.as_numpy(n).reshape(-1)[0]) for n in outputs[1:])
        rate = f"{accepted / drafted:.0%}" if drafted else "-"
        print(f"\n[{tokens} tokens; {drafted} drafted, {accepted} accepted ({rate})]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
