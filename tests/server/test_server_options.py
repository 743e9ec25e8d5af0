"""Server options from the profile against a real tritonserver: gRPC over TLS with a self-signed
certificate for 127.0.0.1 (made by openssl), inference and metadata restricted to a header key
over gRPC (the key from an environment variable) and HTTP. A client without TLS is refused at the
handshake, one without the key with Triton's restricted-API error, one with both is served the
plain server's text; health stays open for probes; the OpenAI frontend, a gRPC client holding the
certificate and the key, still serves. Then mutual TLS: a client without a certificate is refused."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import aiohttp
import grpc
import pytest
from support.servers import variant_server, with_dtype
from support.tls import authority, self_signed
from tritonclient.utils import InferenceServerException

from specdec.build.triton_flags import GRPC_HEADER_PREFIX, GRPC_RESTRICTED_ERROR, HTTP_RESTRICTED_ERROR
from specdec.cli import main
from specdec.client.client import Access, Record, RequestParams, TritonClient, http_generate, openai_generate
from specdec.config import ServerOptions
from specdec.triton.edge import GRPC_STREAM

pytestmark = [pytest.mark.server, pytest.mark.slow]

KEY_ENV = "SPECDEC_TEST_INFERENCE_KEY"
KEY = "s3cret-for-tests"
GRPC_HEADER, HTTP_HEADER = "api-key", "x-api-key"
HTTP_KEY = "http-s3cret"
PROMPT = "Name three colours of the rainbow."
GREEDY = RequestParams(max_tokens=16, temperature=0.0)


def server_options(base: ServerOptions, **changes) -> ServerOptions:
    """The base options with `changes`, validated as a profile's would be."""
    return ServerOptions.model_validate({**base.model_dump(), **changes})


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def secured(embedded_profile, smollm_dir, certificate):
    cert, key = certificate
    options = server_options(
        embedded_profile.server,
        tls={"cert": str(cert), "key": str(key)},
        restricted_apis=[
            {"protocol": "grpc", "apis": ["inference", "metadata"], "header": GRPC_HEADER, "value_env": KEY_ENV},
            {"protocol": "http", "apis": ["inference", "metadata"], "header": HTTP_HEADER, "value": HTTP_KEY},
        ],
        extra_flags=[{"flag": "--grpc-keepalive-time", "value": 60000}],
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv(KEY_ENV, KEY)
        with variant_server(embedded_profile, smollm_dir, "test-secured", server=options,
                            **with_dtype(embedded_profile, "float32")) as srv:  # fmt: skip
            yield srv


PLAIN = Access()


def generate(url: str, access: Access = PLAIN, params: RequestParams = GREEDY) -> Record:
    async def main() -> Record:
        async with TritonClient(url, access) as client:
            return await client.generate(PROMPT, params, stream=True)

    return asyncio.run(main())


def ready(url: str, access: Access = PLAIN) -> bool:
    async def main() -> bool:
        async with TritonClient(url, access) as client:
            return await client.client.is_server_ready(headers=dict(access.headers) or None)

    return asyncio.run(main())


def test_the_argv_turns_tls_and_the_restricted_apis_on(secured, certificate):
    cmdline = " ".join(secured.process.args)
    cert, key = certificate
    assert f"--grpc-use-ssl=true --grpc-server-cert={cert} --grpc-server-key={key}" in cmdline
    assert f"--grpc-restricted-protocol=inference,metadata:{GRPC_HEADER}={KEY}" in cmdline
    assert f"--http-restricted-api=inference,metadata:{HTTP_HEADER}={HTTP_KEY}" in cmdline
    assert "--grpc-keepalive-time=60000" in cmdline


def test_a_client_without_tls_is_refused(secured):
    # the handshake fails: grpc's own error from a stream, tritonclient's from a unary call
    with pytest.raises(grpc.RpcError) as err:
        generate(secured.grpc_url)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(InferenceServerException) as refused:
        ready(secured.grpc_url)
    assert "UNAVAILABLE" in str(refused.value)


def test_a_tls_client_without_the_key_is_refused_with_tritons_error(secured, certificate):
    refusal = GRPC_RESTRICTED_ERROR.format(header=GRPC_HEADER_PREFIX + GRPC_HEADER)
    access = Access(tls=True, root_cert=str(certificate[0]))
    wrong = Access(tls=True, root_cert=str(certificate[0]), headers=((GRPC_HEADER_PREFIX + GRPC_HEADER, "guess"),))
    for refused in (access, wrong):
        for _ in range(10):  # a race would show as INTERNAL "Internal error from Core" (edge.py)
            with pytest.raises(grpc.RpcError) as err:  # the stream ends with Triton's status
                generate(secured.grpc_url, refused)
            assert (err.value.code(), err.value.details()) == (grpc.StatusCode.UNAVAILABLE, refusal)
    assert ready(secured.grpc_url, access)  # health stays open: probes carry no key


def test_the_edges_stream_refusal_is_tritonservers_own(secured, certificate):
    """The edge refuses a restricted stream itself (edge.py) with what tritonserver's own endpoint,
    behind it, answers a stream without the header: before any request is written to it."""

    async def tritons_answer() -> tuple[grpc.StatusCode, str]:
        creds = grpc.ssl_channel_credentials(certificate[0].read_bytes())
        async with grpc.aio.secure_channel(secured.internal.grpc_url, creds) as channel:
            call = channel.stream_stream(GRPC_STREAM)()
            return await asyncio.wait_for(call.code(), timeout=30), await call.details()

    with pytest.raises(grpc.RpcError) as err:
        generate(secured.grpc_url, Access(tls=True, root_cert=str(certificate[0])))
    assert (err.value.code(), err.value.details()) == asyncio.run(tritons_answer())


def test_a_tls_client_with_the_key_is_served_the_plain_servers_text(secured, server, certificate):
    access = Access(tls=True, root_cert=str(certificate[0]), headers=((GRPC_HEADER_PREFIX + GRPC_HEADER, KEY),))
    served = generate(secured.grpc_url, access)
    plain = generate(server.grpc_url)
    assert served.error is None and plain.error is None
    assert served.num_output_tokens == GREEDY.max_tokens
    assert served.text == plain.text


def test_http_inference_needs_its_key_and_health_does_not(secured, server):
    body = json.dumps({"text_input": PROMPT, "max_tokens": GREEDY.max_tokens, "temperature": 0.0}).encode()
    url = f"http://{secured.http_url}/v2/models/ensemble/generate"
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=60)
    assert err.value.code == 403
    assert json.loads(err.value.read())["error"] == HTTP_RESTRICTED_ERROR.format(header=HTTP_HEADER)
    keyed = Access(headers=((HTTP_HEADER, HTTP_KEY),))
    served = asyncio.run(http_generate(secured.http_url, PROMPT, GREEDY, access=keyed))
    plain = asyncio.run(http_generate(server.http_url, PROMPT, GREEDY))
    assert served.error is None and served.text == plain.text
    with urllib.request.urlopen(f"http://{secured.http_url}/v2/health/ready", timeout=10) as resp:
        assert resp.status == 200


def test_the_openai_frontend_still_serves(secured, server):
    async def chat(base_url: str, model: str) -> Record:
        async with aiohttp.ClientSession() as session:
            return await openai_generate(session, base_url, model, PROMPT, GREEDY)

    served = asyncio.run(chat(secured.openai_url, secured.profile.name))
    plain = asyncio.run(chat(server.openai_url, server.profile.name))
    assert served.error is None and served.text and served.text == plain.text


def test_mutual_tls_refuses_a_client_without_a_certificate(embedded_profile, smollm_dir, tmp_path):
    ca = authority(tmp_path)
    options = server_options(
        embedded_profile.server,
        tls={"cert": str(ca.server_cert), "key": str(ca.server_key), "ca_cert": str(ca.ca),
             "client_ca_cert": str(ca.ca), "client_cert": str(ca.client_cert), "client_key": str(ca.client_key)},
    )  # fmt: skip
    with variant_server(embedded_profile, smollm_dir, "test-mutual-tls", server=options) as srv:
        assert "--grpc-use-ssl-mutual=true" in srv.process.args
        with pytest.raises(grpc.RpcError) as err:
            generate(srv.grpc_url, Access(tls=True, root_cert=str(ca.ca)))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        mine = generate(srv.grpc_url, Access(True, str(ca.ca), str(ca.client_cert), str(ca.client_key)))
        assert mine.error is None and mine.num_output_tokens == GREEDY.max_tokens

        async def chat() -> Record:  # the frontend presents the profile's client certificate
            async with aiohttp.ClientSession() as session:
                return await openai_generate(session, srv.openai_url, srv.profile.name, PROMPT, GREEDY)

        assert asyncio.run(chat()).text == mine.text


def test_specdec_generate_reaches_it_with_the_certificate_and_the_key(secured, certificate, capsys):
    def words(captured) -> str:  # what the command printed, its lines unwrapped
        return " ".join((captured.out + captured.err).split())

    header = (GRPC_HEADER_PREFIX + GRPC_HEADER, KEY)
    reach = ["generate", PROMPT, "--url", secured.grpc_url, "--max-tokens", str(GREEDY.max_tokens),
             "--temperature", "0", "--ssl-root-cert", str(certificate[0])]  # fmt: skip
    assert main([*reach, "--header", "=".join(header)]) == 0
    served = generate(secured.grpc_url, Access(True, str(certificate[0]), headers=(header,)))
    assert served.text and " ".join(served.text.split()) in words(capsys.readouterr())
    assert main(reach) == 1
    assert GRPC_RESTRICTED_ERROR.format(header=header[0]) in words(capsys.readouterr())
