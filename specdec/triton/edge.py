"""The server's edge: the HTTP and gRPC endpoints clients reach, in front of tritonserver's own,
which listen on 127.0.0.1 on ports of their own (specdec/triton/serve.py starts both).

    python -m specdec.triton.edge --http HOST:PORT --grpc HOST:PORT \\
        --triton-http 127.0.0.1:P --triton-grpc 127.0.0.1:Q --max-body-bytes N

It does what tritonserver 2.51 cannot (specdec/build/triton_access.py):
- **Bodies are bounded before they are read.** Over HTTP a body longer than --max-body-bytes is
  refused with 413 from its Content-Length, before a client that sent `Expect: 100-continue`
  sends it, or as soon as a body without one passes the bound; a compressed body is refused
  (tritonserver would inflate it whole). Over gRPC a message longer than the bound is refused with
  RESOURCE_EXHAUSTED from its length prefix, before it is read (gRPC's max_receive_message_length).
  tritonserver itself reads every HTTP body whole and takes gRPC messages up to 2 GiB.
- **Clients run the ensemble only.** Inference (infer, generate, generate_stream, ModelInfer,
  ModelStreamInfer) reaches the served models (--model, the ensemble) and is refused for any other,
  naming the model (specdec.triton.internal.refusal): HTTP 403, gRPC PERMISSION_DENIED, and in a
  gRPC stream an error response, as tritonserver answers a request it fails there. Health, server
  and model metadata, model configuration, readiness and statistics pass for every model: they are
  read-only, and genai-perf's perf_analyzer reads an ensemble's composing models' configurations
  and statistics. Repository, shared-memory, trace and logging APIs are refused.
- **A restricted stream is refused by the edge.** With gRPC inference restricted to a header
  (server.restricted_apis), a ModelStreamInfer stream without it gets tritonserver's own status,
  UNAVAILABLE naming the header (tritonserver ends such a stream when it opens:
  specdec/build/triton_flags.py GRPC_STREAM_CHECKED_AT_OPEN_WHERE), once its first request has
  arrived. A status that overtakes a write of a request makes the write fail, and grpc then ends
  the call with INTERNAL "Internal error from Core" in its place: forwarded, the refusal would race
  the edge's first write, and refused before that request, the client's.
Everything else passes through as it came: headers (tritonserver checks every other restricted
API's), bodies, streamed responses (SSE, gRPC streams), errors, and a client's cancellation of a
gRPC stream, which cancels the stream to tritonserver.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Iterable
from functools import partial
from pathlib import Path

import aiohttp
import grpc
from aiohttp import web
from yarl import URL

from specdec.build.triton_flags import GRPC_RESTRICTED_ERROR
from specdec.triton.internal import refusal
from specdec.triton.server_flags import STREAM_KEY_ENV

SERVED = ("ensemble",)

# --- what passes: Triton 2.51's own routes (specdec/build/triton_access.py HTTP_ROUTES) ------------------
_SERVER_PATH = re.compile(r"/v2(?:/health/(?:live|ready))?")
_MODEL_PATH = re.compile(
    r"/v2/models/(?P<model>[^/]+)(?:/versions/[0-9]+)?(?:/(?P<kind>infer|generate|generate_stream|ready|config|stats))?"
)
_INFERENCE = ("infer", "generate", "generate_stream")
GRPC_SERVICE = "inference.GRPCInferenceService"
GRPC_READ_ONLY = ("ServerLive", "ServerReady", "ServerMetadata", "ModelReady", "ModelMetadata", "ModelConfig",
                  "ModelStatistics")  # fmt: skip
GRPC_INFER, GRPC_STREAM = f"/{GRPC_SERVICE}/ModelInfer", f"/{GRPC_SERVICE}/ModelStreamInfer"
GRPC_HEALTH = "/grpc.health.v1.Health/Check"  # the standard health check tritonserver also serves


def http_refusal(path: str, served: Iterable[str] = SERVED) -> str | None:
    """Why a request for `path` (as sent: Triton matches model names undecoded; no query) is not
    forwarded, or None when it is."""
    if _SERVER_PATH.fullmatch(path) or path == "/v2/models/stats":
        return None
    if match := _MODEL_PATH.fullmatch(path):
        if match["kind"] not in _INFERENCE or match["model"] in served:
            return None
        return refusal(match["model"])
    return f"{path}: not served to clients"


def grpc_refusal(method: str) -> str | None:
    """Why a gRPC method is refused whatever it asks, or None when it may pass (inference still
    depends on the model it names: infer_refusal)."""
    if method == GRPC_HEALTH or method in (GRPC_INFER, GRPC_STREAM):
        return None
    service, _, name = method.lstrip("/").partition("/")
    if service == GRPC_SERVICE and name in GRPC_READ_ONLY:
        return None
    return f"{name or method}: not served to clients"


def infer_refusal(message: bytes, served: Iterable[str] = SERVED) -> str | None:
    """Why a serialized ModelInferRequest is refused, or None when its model is served."""
    from google.protobuf.message import DecodeError
    from tritonclient.grpc.service_pb2 import ModelInferRequest

    try:
        model = ModelInferRequest.FromString(message).model_name
    except DecodeError:
        return "the request is not a ModelInferRequest"
    return None if model in served else refusal(model)


def too_large(limit: int) -> str:
    return f"the request body is larger than {limit} bytes (server.max_body_bytes)"


# Headers that end at this hop (RFC 9110 7.6.1), and those the next request sets itself
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
               "proxy-authenticate", "proxy-authorization"}  # fmt: skip
_REQUEST_SETS = {"host", "content-length", "expect"}


def forwarded_headers(headers: Iterable[tuple[str, str]], drop: set[str] = _REQUEST_SETS) -> list[tuple[str, str]]:
    """The headers to pass on: all but the hop-by-hop ones and `drop`."""
    return [(k, v) for k, v in headers if k.lower() not in _HOP_BY_HOP and k.lower() not in drop]


# --- HTTP ----------------------------------------------------------------------------------------------
class HttpEdge:
    """The HTTP endpoint: checks, then forwards to tritonserver's and streams its answer back."""

    def __init__(self, triton_url: str, max_body_bytes: int, served: Iterable[str] = SERVED):
        self.upstream, self.limit, self.served = f"http://{triton_url}", max_body_bytes, tuple(served)
        self.session: aiohttp.ClientSession | None = None

    def application(self) -> web.Application:
        app = web.Application(client_max_size=self.limit)  # a body without Content-Length: read() stops here
        app.router.add_route("*", "/{path:.*}", self.forward, expect_handler=self.expect)
        app.on_startup.append(self.start)
        app.on_cleanup.append(self.stop)
        return app

    async def start(self, app: web.Application) -> None:
        # the client's own Accept-Encoding goes through, none of aiohttp's: the answer stays as sent;
        # a connection to tritonserver for each request in flight (aiohttp's default pool holds 100)
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False,
                                             timeout=aiohttp.ClientTimeout(total=None),
                                             skip_auto_headers=("Accept-Encoding", "User-Agent"))  # fmt: skip

    async def stop(self, app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    def refused(self, request: web.Request) -> web.Response | None:
        """The answer to a request the edge refuses on its headers alone, or None."""
        if why := http_refusal(request.rel_url.raw_path, self.served):
            return _error(why, 403)
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            return _error(f"Content-Encoding {encoding}: send the body uncompressed (tritonserver would inflate "
                          "it without a bound)", 415)  # fmt: skip
        if request.content_length is not None and request.content_length > self.limit:
            return _error(too_large(self.limit), 413)
        return None

    async def expect(self, request: web.Request) -> web.Response | None:
        """`Expect: 100-continue`: refuse before the client sends its body, else let it send (what
        aiohttp's default expect handler does)."""
        if (answer := self.refused(request)) is not None:
            return answer
        if request.headers.get("Expect", "").lower() == "100-continue" and request.version == aiohttp.HttpVersion11:
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0
        return None

    async def forward(self, request: web.Request) -> web.StreamResponse:
        if (answer := self.refused(request)) is not None:
            return answer
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(too_large(self.limit), 413)
        assert self.session is not None
        url = URL(self.upstream + request.rel_url.raw_path_qs, encoded=True)
        try:
            headers = forwarded_headers(request.headers.items())
            async with self.session.request(request.method, url, data=body or None, headers=headers) as upstream:
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for name, value in forwarded_headers(upstream.headers.items(), {"content-length"}):
                    response.headers.add(name, value)
                if upstream.content_length is not None:
                    response.content_length = upstream.content_length
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except aiohttp.ClientError as err:
            return _error(f"tritonserver is not reachable: {err}", 503)


def _error(message: str, status: int) -> web.Response:
    """An error as tritonserver words one: {"error": "<message>"}. (aiohttp then reads what is
    left of a refused body and drops it, for up to 10 seconds, so that a client that sends its
    whole body before it reads gets the answer.)"""
    return web.json_response({"error": message}, status=status)


# --- gRPC ----------------------------------------------------------------------------------------------
def _metadata(context: grpc.aio.ServicerContext) -> tuple[tuple[str, str | bytes], ...]:
    """The client's metadata to pass on: its own keys (a restricted API's header among them), not
    the transport's."""
    return tuple((k, v) for k, v in context.invocation_metadata() or ()
                 if not k.startswith((":", "grpc-")) and k not in ("user-agent", "content-type", "te"))  # fmt: skip


class GrpcEdge(grpc.GenericRpcHandler):
    """The gRPC endpoint: every method of tritonserver's service, as bytes, checked as the module
    says; the rest (an unknown method) UNIMPLEMENTED, as tritonserver answers it."""

    def __init__(self, channel: grpc.aio.Channel, served: Iterable[str] = SERVED,
                 stream_key: tuple[str, str] | None = None):  # fmt: skip
        self.channel, self.served, self.stream_key = channel, tuple(served), stream_key

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method
        service, _, _ = method.lstrip("/").partition("/")
        if method == GRPC_STREAM:
            return grpc.stream_stream_rpc_method_handler(partial(self.stream, method))
        if service == GRPC_SERVICE or method == GRPC_HEALTH:
            return grpc.unary_unary_rpc_method_handler(partial(self.unary, method))
        return None

    async def unary(self, method: str, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        why = grpc_refusal(method) or (infer_refusal(request, self.served) if method == GRPC_INFER else None)
        if why is not None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)
        try:
            return await self.channel.unary_unary(method)(request, metadata=_metadata(context),
                                                          timeout=context.time_remaining())  # fmt: skip
        except grpc.aio.AioRpcError as err:
            await context.abort(err.code(), err.details() or "")
            raise  # not reached: abort raises

    async def stream(self, method: str, requests: AsyncIterator[bytes],
                     context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:  # fmt: skip
        """A ModelStreamInfer stream: each request checked and written to tritonserver's stream,
        each of its responses passed back. A refused request is answered in the stream with an
        error, as tritonserver answers a request it fails there, and the stream goes on; a request
        over the bound ends the stream with gRPC's RESOURCE_EXHAUSTED; a client that cancels (or
        goes away) cancels tritonserver's stream."""
        from tritonclient.grpc.service_pb2 import ModelStreamInferResponse

        if self.stream_key is not None and self.stream_key not in (context.invocation_metadata() or ()):
            # tritonserver ends such a stream before it reads a request; the edge takes the first
            # one first, so that the client's write of it is done when the status reaches the client
            await anext(requests, None)
            await context.abort(grpc.StatusCode.UNAVAILABLE, GRPC_RESTRICTED_ERROR.format(header=self.stream_key[0]))
        call = self.channel.stream_stream(method)(metadata=_metadata(context), timeout=context.time_remaining())
        answers: asyncio.Queue = asyncio.Queue()  # responses of both: tritonserver's and the edge's refusals
        end = object()

        async def pump() -> None:
            try:
                async for message in requests:
                    if (why := infer_refusal(message, self.served)) is not None:
                        await answers.put(ModelStreamInferResponse(error_message=why).SerializeToString())
                    else:
                        await call.write(message)
                await call.done_writing()
            except Exception:  # the stream ended, on either side: relay() or the client's cancel says how
                call.cancel()

        async def relay() -> None:
            try:
                async for response in call:
                    await answers.put(response)
            except grpc.aio.AioRpcError as err:
                await answers.put(err)
            finally:
                await answers.put(end)

        tasks = [asyncio.create_task(pump()), asyncio.create_task(relay())]
        try:
            while (answer := await answers.get()) is not end:
                if isinstance(answer, grpc.aio.AioRpcError):
                    await context.abort(answer.code(), answer.details() or "")
                yield answer
        finally:
            call.cancel()
            for task in tasks:
                task.cancel()


def upstream_port(cmdline: list[str]) -> int | None:
    """The gRPC port of the tritonserver an edge forwards to, from the edge's command line; None
    when `cmdline` is not an edge's (what finds the server's processes from a port clients use)."""
    if "specdec.triton.edge" not in cmdline:
        return None
    return next((int(a.rsplit(":", 1)[1]) for a in cmdline if a.startswith("--triton-grpc=")), None)


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


async def serve(args: argparse.Namespace) -> None:
    """Both endpoints until SIGTERM or SIGINT."""
    served = tuple(args.model or SERVED)
    # to tritonserver: its answers are trusted, whatever their size
    options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", args.max_body_bytes)]
    if args.triton_root_cert:  # TLS on tritonserver's gRPC endpoint (server.tls): as the bundle's clients reach it
        creds = grpc.ssl_channel_credentials(_read(args.triton_root_cert), _read(args.triton_key),
                                             _read(args.triton_cert))  # fmt: skip
        if args.triton_server_name:  # the name in its certificate, where that is not 127.0.0.1
            options.append(("grpc.ssl_target_name_override", args.triton_server_name))
        channel = grpc.aio.secure_channel(args.triton_grpc, creds, options=options)
    else:
        channel = grpc.aio.insecure_channel(args.triton_grpc, options=options)
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", args.max_body_bytes),
                                      ("grpc.max_send_message_length", -1)])  # fmt: skip
    key = os.environ.get(STREAM_KEY_ENV)  # [header, value] (server_flags.stream_key)
    server.add_generic_rpc_handlers((GrpcEdge(channel, served, tuple(json.loads(key)) if key else None),))
    if args.tls_cert:  # the same TLS as tritonserver's own gRPC endpoint, so that clients see no difference
        creds = grpc.ssl_server_credentials([(_read(args.tls_key), _read(args.tls_cert))],
                                            root_certificates=_read(args.tls_client_ca),
                                            require_client_auth=bool(args.tls_client_ca))  # fmt: skip
        server.add_secure_port(args.grpc, creds)
    else:
        server.add_insecure_port(args.grpc)
    runner = web.AppRunner(HttpEdge(args.triton_http, args.max_body_bytes, served).application(), access_log=None,
                           handler_cancellation=True)  # fmt: skip
    await runner.setup()
    host, _, port = args.http.rpartition(":")
    await server.start()
    await web.TCPSite(runner, host, int(port), shutdown_timeout=2).start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(2)
    await runner.cleanup()
    await channel.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--http", required=True, help="HOST:PORT the HTTP endpoint listens on")
    ap.add_argument("--grpc", required=True, help="HOST:PORT the gRPC endpoint listens on")
    ap.add_argument("--triton-http", required=True, help="tritonserver's own HTTP endpoint, HOST:PORT")
    ap.add_argument("--triton-grpc", required=True, help="tritonserver's own gRPC endpoint, HOST:PORT")
    ap.add_argument("--max-body-bytes", type=int, required=True, help="the largest body or gRPC message taken")
    ap.add_argument("--model", action="append", help=f"a model clients may run (repeatable; default {SERVED[0]})")
    ap.add_argument("--tls-cert", help="TLS on the gRPC endpoint: its certificate (PEM)")
    ap.add_argument("--tls-key", help="its private key (PEM)")
    ap.add_argument("--tls-client-ca", help="mutual TLS: clients must present a certificate this CA signed")
    ap.add_argument("--triton-root-cert", help="tritonserver's gRPC over TLS, trusting this certificate (PEM)")
    ap.add_argument("--triton-cert", help="mutual TLS to tritonserver: this edge's certificate (PEM)")
    ap.add_argument("--triton-key", help="its private key (PEM)")
    ap.add_argument("--triton-server-name", help="the name tritonserver's certificate carries")
    args = ap.parse_args(argv)
    if bool(args.tls_cert) != bool(args.tls_key):
        ap.error("--tls-cert and --tls-key go together")
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
