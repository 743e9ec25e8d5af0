"""The OpenAI-compatible HTTP server: each request checked (protocol.py), sent to the ensemble
over Triton's gRPC streaming API, and answered as OpenAI's objects, whole or as server-sent
events ending in `data: [DONE]`.

    python -m specdec.openai.server --triton-url 127.0.0.1:8001 --model NAME [--host 127.0.0.1] [--port 9000]
        [--state-file BUILD/serve-state.json]

GET /health/ready answers 200 while the replica serves: tritonserver ready (every model) and,
with --state-file (`specdec serve` passes its own), the supervisor's state `ready`, renewed
lately; else 503. Triton's own /v2/health/ready stays 200 after a model's Python stub has died:
a balancer checks this endpoint instead (deploy/haproxy/haproxy.cfg.template).

A client that closes its stream cancels the ensemble request (the gRPC stream is cancelled, and
spec_decode frees what the request held). Bodies are bounded (--max-body-bytes) before they are
read whole.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from aiohttp import web
from tritonclient.utils import InferenceServerException

from specdec.client.client import Access, TritonClient
from specdec.contract import ENSEMBLE_INPUTS
from specdec.openai.protocol import (
    Answer,
    GenerationRequest,
    OpenAIError,
    Totals,
    error_from_triton,
    models,
    parse_chat,
    parse_completion,
)
from specdec.triton.serve import READY
from specdec.triton.server_flags import HEADERS_ENV

STALE_S = 30.0  # a supervisor's state older than this: it is gone or stuck (docker/healthcheck.py's limit)
OUTPUTS = ["text_output", "num_input_tokens", "num_output_tokens", "total_draft_tokens", "total_accepted_draft_tokens",
           "total_draft_rounds"]  # fmt: skip


class Frontend:
    """The routes over one Triton server's ensemble."""

    def __init__(self, triton_url: str, model: str, max_tokens_limit: int, state_file: Path | None = None,
                 access: Access | None = None):  # fmt: skip
        self.triton_url, self.model, self.max_tokens_limit = triton_url, model, max_tokens_limit
        self.access = access or Access()  # TLS and restricted gRPC APIs (server.tls, server.restricted_apis)
        self.state_file = state_file
        self.started = int(time.time())
        self.client: TritonClient | None = None

    async def chunks(self, req: GenerationRequest) -> AsyncIterator[tuple[str, Totals]]:
        """The ensemble's text, chunk by chunk, with the request's totals so far."""
        assert self.client is not None
        inputs = self.client.inputs({**req.inputs, "stream": req.stream}, ENSEMBLE_INPUTS)
        try:
            async for result in self.client.stream("ensemble", inputs, OUTPUTS):
                value = {name: result.as_numpy(name).reshape(-1)[0] for name in OUTPUTS}
                yield value["text_output"].decode("utf-8"), Totals(*(int(value[name]) for name in OUTPUTS[1:]))
        except RuntimeError as err:  # the ensemble refused or failed the request
            raise error_from_triton(str(err)) from None
        except (InferenceServerException, grpc.RpcError) as err:  # tritonserver unreachable, or gone mid-request
            detail = err.message() if isinstance(err, InferenceServerException) else None
            if detail is None:  # grpc's own error (an AioRpcError: the stream broke off)
                detail = err.details() if isinstance(err, grpc.aio.AioRpcError) else str(err)
            raise OpenAIError(f"the model server is unavailable: {detail}", None, status=503, kind="server_error",
                              code="unavailable") from None  # fmt: skip

    async def ready(self, request: web.Request) -> web.Response:
        """GET /health/ready: 200 {"ready": true} while this replica serves, else 503 with why."""
        why = self.supervisor_not_ready()
        if why is None:
            assert self.client is not None
            try:
                ready = self.client.client.is_server_ready(headers=self.client.headers)  # (a restricted API's too)
                if not await asyncio.wait_for(ready, timeout=2):
                    why = "tritonserver is not ready"
            except (InferenceServerException, TimeoutError) as err:
                why = f"tritonserver does not answer: {err}"
        if why is None:
            return web.json_response({"ready": True})
        return web.json_response({"ready": False, "why": why}, status=503)

    def supervisor_not_ready(self) -> str | None:
        """Why the supervisor's state file (serve-state.json) says not ready; None: ready, or
        there is no supervisor to ask."""
        if self.state_file is None:
            return None
        try:
            data = json.loads(self.state_file.read_text())
            state, age = str(data["state"]), time.time() - float(data["time"])
        except (OSError, ValueError, KeyError, TypeError):
            return f"no supervisor state in {self.state_file}"
        if state != READY:
            return f"the supervisor is {state}"
        if age > STALE_S:
            return f"the supervisor's state is {age:.0f} s old"
        return None

    async def list_models(self, request: web.Request) -> web.Response:
        return web.json_response(models(self.model, self.started))

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, parse_chat)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, parse_completion)

    async def _generate(self, request: web.Request, parse) -> web.StreamResponse:
        try:
            try:
                body = await request.json()
            except (ValueError, UnicodeDecodeError):
                raise OpenAIError("the request body is not JSON") from None
            req = parse(body, self.model, self.max_tokens_limit)
            if not req.stream:
                text, totals = "", Totals()
                async for chunk, so_far in self.chunks(req):
                    text, totals = text + chunk, so_far
                return web.json_response(Answer(req).whole(text, totals))
        except OpenAIError as err:
            return web.json_response(err.body(), status=err.status)
        return await self._stream(request, req)

    async def _stream(self, request: web.Request, req: GenerationRequest) -> web.StreamResponse:
        answer, totals = Answer(req), Totals()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        chunks = self.chunks(req)
        try:
            first = await anext(chunks, None)  # a refusal still gets its 400, before the stream starts
        except OpenAIError as err:
            return web.json_response(err.body(), status=err.status)
        await response.prepare(request)

        async def send(obj: dict | str) -> None:
            data = obj if isinstance(obj, str) else json.dumps(obj)
            await response.write(f"data: {data}\n\n".encode())

        try:
            if first is not None:
                text, totals = first
                await send(answer.chunk(text, totals, first=True))
                async for text, so_far in chunks:
                    totals = so_far
                    if text or answer.req.continuous_usage:
                        await send(answer.chunk(text, totals))
            for obj in answer.last(totals):
                await send(obj)
        except OpenAIError as err:  # failed midway: the stream ends with the error
            await send(err.body())
        finally:
            await chunks.aclose()  # a client gone (a failed write, a cancelled handler): the request is cancelled
        await send("[DONE]")
        await response.write_eof()
        return response

    async def start(self, app: web.Application) -> None:
        self.client = TritonClient(self.triton_url, self.access)

    async def stop(self, app: web.Application) -> None:
        if self.client is not None:
            await self.client.close()


def application(frontend: Frontend, max_body_bytes: int) -> web.Application:
    app = web.Application(client_max_size=max_body_bytes)
    app.router.add_get("/v1/models", frontend.list_models)
    app.router.add_get("/health/ready", frontend.ready)
    app.router.add_post("/v1/chat/completions", frontend.chat)
    app.router.add_post("/v1/completions", frontend.completions)
    app.on_startup.append(frontend.start)
    app.on_cleanup.append(frontend.stop)
    return app


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="The OpenAI-compatible frontend of a specdec server.")
    ap.add_argument("--triton-url", required=True, help="Triton's gRPC address, host:port")
    ap.add_argument("--model", required=True, help="the model id clients name (the profile's name)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9000)
    ap.add_argument("--max-tokens-limit", type=int, default=4096)
    ap.add_argument("--max-body-bytes", type=int, default=1 << 20)
    ap.add_argument("--state-file", type=Path, help="the supervisor's state (serve-state.json), for GET /health/ready")
    ap.add_argument("--triton-root-cert", help="Triton's gRPC over TLS, trusting this certificate (PEM)")
    ap.add_argument("--triton-server-name", help="the name Triton's certificate carries (default: --triton-url's host)")
    ap.add_argument("--triton-cert", help="mutual TLS: this frontend's certificate (PEM)")
    ap.add_argument("--triton-key", help="mutual TLS: its private key (PEM)")
    args = ap.parse_args(argv)
    # the restricted gRPC APIs' headers come in the environment (`specdec serve` sets it), kept off
    # the command line, which any local user can read
    headers = tuple(json.loads(os.environ.get(HEADERS_ENV) or "{}").items())
    access = Access(bool(args.triton_root_cert), args.triton_root_cert, args.triton_cert, args.triton_key,
                    args.triton_server_name, headers)  # fmt: skip
    frontend = Frontend(args.triton_url, args.model, args.max_tokens_limit, args.state_file, access)
    app = application(frontend, args.max_body_bytes)
    # handler_cancellation: a client that goes away cancels its handler, and with it its request
    web.run_app(app, host=args.host, port=args.port, handler_cancellation=True, print=None,
                shutdown_timeout=5)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
