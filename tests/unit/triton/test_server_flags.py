"""Server options in a profile (server.tls, server.restricted_apis, server.extra_flags): the schema
refuses what cannot work naming the key, the flags they become are exactly tritonserver 2.51's
(specdec/build/triton_flags.py), and what the bundle's own clients need follows from them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from specdec.build.triton_flags import CONTAINER_FLAGS, FLAGS, GRPC_HEADER_PREFIX
from specdec.config import (
    DEFAULT_PROFILE,
    Profile,
    ProfileError,
    ServerOptions,
    load_profile,
    parse_profile,
    resolve_relative_paths,
)
from specdec.triton.serve import CONTAINER_BINARY, CONTAINER_SERVER, TritonInstall, TritonServer
from specdec.triton.server_flags import (
    BUNDLE_BACKEND_CONFIG,
    BUNDLE_SETS,
    HEADERS_ENV,
    OVERRIDABLE,
    REFUSED,
    STREAM_KEY_ENV,
    TRTLLM_SETS,
    client_headers,
    client_tls,
    frontend_access,
    server_flags,
    stream_key,
)

EMBEDDED = resolve_relative_paths(yaml.safe_load(DEFAULT_PROFILE.read_text()), DEFAULT_PROFILE.resolve().parent)
ENV = {"INFERENCE_KEY": "s3cret"}


def profile_with(**server) -> Profile:
    data = copy.deepcopy(EMBEDDED)
    data.setdefault("server", {}).update(server)
    return parse_profile(data, "test.yaml")


def refusal(**server) -> str:
    with pytest.raises(ProfileError) as err:
        profile_with(**server)
    return str(err.value)


def flag_refusal(profile: Profile, environ: dict[str, str] = ENV) -> str:
    with pytest.raises(ProfileError) as err:
        server_flags(profile, environ)
    return str(err.value)


@pytest.fixture
def pem(tmp_path) -> dict[str, str]:
    """Files where a profile's TLS section names them (their content is tritonserver's to read)."""
    names = ("cert", "key", "ca_cert", "client_ca_cert", "client_cert", "client_key")
    paths = {name: tmp_path / f"{name}.pem" for name in names}
    for path in paths.values():
        path.write_text("-----BEGIN CERTIFICATE-----\n")
    return {name: str(path) for name, path in paths.items()}


# --- the flags a profile becomes -----------------------------------------------------------------
def test_a_profile_without_server_options_adds_no_flag():
    assert server_flags(load_profile(), {}) == []


def test_tls_restricted_apis_and_extra_flags_become_exactly_these_flags(pem):
    profile = profile_with(
        tls={"cert": pem["cert"], "key": pem["key"]},
        restricted_apis=[
            {"protocol": "grpc", "apis": ["inference", "metadata"], "header": "api-key", "value_env": "INFERENCE_KEY"},
            {"protocol": "http", "apis": ["model-repository"], "header": "admin-key", "value": "a:b=c"},
        ],
        extra_flags=[
            {"flag": "--grpc-keepalive-time", "value": 7200000},
            {"flag": "--log-format", "value": "ISO8601"},
            {"flag": "--exit-on-error", "value": False},
            {"flag": "--backend-config", "value": "python,stub-timeout-seconds=60"},
            {"flag": "--backend-config", "value": "default-max-batch-size=4"},
            {"flag": "--log-verbose", "value": 1},
            {"flag": "--min-supported-compute-capability", "value": 8},
        ],
    )
    assert server_flags(profile, ENV) == [
        "--grpc-use-ssl=true",
        f"--grpc-server-cert={pem['cert']}",
        f"--grpc-server-key={pem['key']}",
        "--grpc-restricted-protocol=inference,metadata:api-key=s3cret",
        "--http-restricted-api=model-repository:admin-key=a:b=c",  # the key ends at the first "=" after ":"
        "--grpc-keepalive-time=7200000",
        "--log-format=ISO8601",
        "--exit-on-error=false",
        "--backend-config=python,stub-timeout-seconds=60",
        "--backend-config=default-max-batch-size=4",
        "--log-verbose=1",
        "--min-supported-compute-capability=8",
    ]


def test_mutual_tls_requires_client_certificates_signed_by_the_client_ca(pem):
    profile = profile_with(tls=pem)
    assert server_flags(profile, {}) == [
        "--grpc-use-ssl-mutual=true",
        f"--grpc-server-cert={pem['cert']}",
        f"--grpc-server-key={pem['key']}",
        f"--grpc-root-cert={pem['client_ca_cert']}",
    ]


def test_a_flag_without_a_value_is_one_argument():
    profile = profile_with(extra_flags=[{"flag": "--model-namespacing", "value": True}])
    assert server_flags(profile, {}) == ["--model-namespacing=true"]
    assert "--help" not in FLAGS or "help" in REFUSED  # the one flag without a value besides the bundle's own


def test_the_bundles_own_command_sets_only_what_a_profile_may_not(tmp_path, pem):
    """Every flag TritonServer.command gives is recorded and named as the bundle's (or replaceable),
    so a profile's extra flag never silently contradicts one."""
    data = copy.deepcopy(EMBEDDED) | {"build_dir": str(tmp_path / "build")}
    data["server"] = {"tls": {"cert": pem["cert"], "key": pem["key"]}}
    profile = parse_profile(data)
    (profile.repository_dir() / "ensemble").mkdir(parents=True)
    (profile.repository_dir() / "ensemble" / "config.pbtxt").write_text("")
    argv = TritonServer(profile).command(TritonInstall(Path("tritonserver"), tmp_path / "backends"))
    for arg in argv[1:]:
        name = arg.removeprefix("--").partition("=")[0]
        assert name in FLAGS, arg
        if name == "backend-config":
            assert arg.removeprefix("--backend-config=").startswith(BUNDLE_BACKEND_CONFIG)
        else:
            assert name in BUNDLE_SETS or name in OVERRIDABLE, arg


def test_every_recorded_flag_is_allowed_set_by_the_bundle_or_refused_with_a_reason():
    assert set(BUNDLE_SETS) <= set(FLAGS) and set(REFUSED) <= set(FLAGS) and set(TRTLLM_SETS) <= set(FLAGS)
    assert not set(BUNDLE_SETS) & set(REFUSED)
    assert all(BUNDLE_SETS.values()) and all(REFUSED.values())
    allowed = set(FLAGS) - set(BUNDLE_SETS) - set(REFUSED)
    assert {"grpc-keepalive-time", "log-verbose", "trace-config", "backend-config", "metrics-config"} <= allowed


# --- refusals naming their key -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--grpc-port", 9001, "flag: --grpc-port is set by server.grpc_port"),
        ("--http-address", "0.0.0.0", "flag: --http-address is set by server.host"),
        ("--grpc-use-ssl", True, "flag: --grpc-use-ssl is set by server.tls"),
        ("--grpc-restricted-protocol", "a:k=v", "flag: --grpc-restricted-protocol is set by server.restricted_apis"),
        ("--model-repository", "/x", "flag: --model-repository is set by the bundle: the profile's build"),
        ("--model-control-mode", "poll", "flag: --model-control-mode is set by the bundle: model control stays off"),
        ("--disable-auto-complete-config", None, "flag: --disable-auto-complete-config is set by the bundle"),
        ("--grpc-restricted-api", "x", "flag: tritonserver 2.51 has no option --grpc-restricted-api"),
        ("--allow-sagemaker", True, "flag: --allow-sagemaker is refused: listens on 0.0.0.0"),
        ("--log-file", "/tmp/x", "flag: --log-file is refused: the log goes to the bundle's log file"),
        ("--trace-level", "TIMESTAMPS", "flag: --trace-level is refused: deprecated"),
        ("--grpc-keepalive-time", "7200000", "value: --grpc-keepalive-time takes an integer"),
        ("--exit-on-error", 1, "value: --exit-on-error takes true or false"),
        ("--log-format", "iso8601", "value: --log-format takes one of default, ISO8601, got 'iso8601'"),
        ("--rate-limit-resource", "R1", "value: --rate-limit-resource takes a value shaped"),
        ("--backend-config", "python,shm-growth-byte-size=1", "value: python,shm-growth-byte-size is set by"),
        ("--id", "a\nb", "value: --id takes text"),
        ("--id", None, "value: --id needs a value"),
    ],
)  # fmt: skip
def test_an_extra_flag_that_cannot_be_given_is_refused_naming_its_key(flag, value, message):
    extra = {"flag": flag} | ({} if value is None else {"value": value})
    assert f"server.extra_flags.0.{message}" in flag_refusal(profile_with(extra_flags=[extra]))


def test_a_flag_that_takes_one_value_is_refused_twice():
    profile = profile_with(extra_flags=[{"flag": "--log-info", "value": True}, {"flag": "--log-info", "value": False}])
    assert "server.extra_flags.1.flag: --log-info is given twice (also server.extra_flags.0)" in flag_refusal(profile)


def test_the_orchestrator_modes_flags_are_the_bundles_on_tensorrtllm():
    profile = load_profile(DEFAULT_PROFILE.parent / "llama3.1-8b-ngram.yaml")
    extra = [{"flag": "--enable-peer-access", "value": True}]
    server = ServerOptions.model_validate(profile.server.model_dump() | {"extra_flags": extra})
    refused = flag_refusal(profile.model_copy(update={"server": server}))
    assert "server.extra_flags.0.flag: --enable-peer-access is set by the bundle for backend tensorrtllm" in refused
    assert server_flags(profile_with(extra_flags=[{"flag": "--enable-peer-access", "value": False}]), {}) == [
        "--enable-peer-access=false"
    ]


def test_the_gpu_images_tritonserver_takes_its_own_options_within_its_bounds(tmp_path):
    """The GPU image runs tritonserver 2.61 (CONTAINER_FLAGS: 2.51's options and three more, each
    an integer its parser bounds); the bundled 2.51 refuses those three, naming the version."""
    assert not set(CONTAINER_FLAGS) & set(FLAGS)
    given = [{"flag": "--grpc-infer-thread-count", "value": 4}, {"flag": "--http-max-input-size", "value": 2**27},
             {"flag": "--grpc-max-response-pool-size", "value": 1}]  # fmt: skip
    profile = profile_with(extra_flags=given)
    assert server_flags(profile, {}, container=True) == [
        "--grpc-infer-thread-count=4", f"--http-max-input-size={2**27}", "--grpc-max-response-pool-size=1"]  # fmt: skip
    refused = flag_refusal(profile, {})
    assert "server.extra_flags.0.flag: --grpc-infer-thread-count is tritonserver 2.61's (the GPU image's); the " \
           "bundled tritonserver 2.51 has no such option" in refused  # fmt: skip
    for value, bounds in ((1, "from 2 to 128, got 1"), (129, "from 2 to 128, got 129")):
        out_of_bounds = profile_with(extra_flags=[{"flag": "--grpc-infer-thread-count", "value": value}])
        with pytest.raises(
            ProfileError, match=f"extra_flags.0.value: --grpc-infer-thread-count takes an integer {bounds}"
        ):
            server_flags(out_of_bounds, {}, container=True)
    nothing = profile_with(extra_flags=[{"flag": "--http-max-input-size", "value": 0}])
    with pytest.raises(ProfileError, match="--http-max-input-size takes an integer from 1 or more, got 0"):
        server_flags(nothing, {}, container=True)
    with pytest.raises(ProfileError, match=r"tritonserver 2\.61 has no option --grpc-restricted-api"):
        server_flags(profile_with(extra_flags=[{"flag": "--grpc-restricted-api", "value": "x"}]), {}, container=True)
    # the server picks the version from the binary it runs
    data = copy.deepcopy(EMBEDDED) | {"build_dir": str(tmp_path / "build")}
    data["server"] = {"extra_flags": given[:1]}
    served = parse_profile(data)
    (served.repository_dir() / "ensemble").mkdir(parents=True)
    (served.repository_dir() / "ensemble" / "config.pbtxt").write_text("")
    install = TritonInstall(CONTAINER_BINARY, CONTAINER_SERVER / "backends")
    assert TritonServer(served).command(install)[-1] == "--grpc-infer-thread-count=4"
    with pytest.raises(ProfileError, match=r"is tritonserver 2\.61's"):
        TritonServer(served).command(TritonInstall(Path("tritonserver"), tmp_path / "backends"))


def test_a_missing_tls_file_and_an_unset_key_are_refused_when_the_server_starts(tmp_path, pem):
    profile = profile_with(
        tls={"cert": str(tmp_path / "nowhere.pem"), "key": pem["key"]},
        restricted_apis=[{"protocol": "grpc", "apis": ["inference"], "header": "k", "value_env": "UNSET_KEY"}],
    )
    refused = flag_refusal(profile, {})
    assert f"server.tls.cert: no readable file {tmp_path / 'nowhere.pem'}" in refused
    assert "server.restricted_apis.0.value_env: the environment variable UNSET_KEY is not set" in refused
    assert "server.restricted_apis.0.value_env: the value of UNSET_KEY must be printable ASCII" in flag_refusal(
        profile.model_copy(update={"server": profile.server.model_copy(update={"tls": None})}), {"UNSET_KEY": "a\nb"}
    )


def group(**changes) -> dict:
    """A restricted API group of the profile, as YAML gives it."""
    return {"protocol": "grpc", "apis": ["inference"], "header": "k", "value": "v"} | changes


TLS = {"cert": "c.pem", "key": "k.pem"}


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({"tls": TLS | {"https": True}}, "server.tls.https: tritonserver 2.51's HTTP endpoint has no TLS"),
        ({"tls": {"cert": "c.pem"}}, "server.tls.key: Field required"),
        ({"tls": TLS | {"client_ca_cert": "ca"}}, "server.tls: client_ca_cert (mutual TLS) needs client_cert and"),
        ({"tls": TLS | {"client_cert": "c"}}, "server.tls: client_cert and client_key go with client_ca_cert"),
        ({"restricted_apis": [group(apis=["health"])]}, "server.restricted_apis.0: apis: health stays open"),
        ({"restricted_apis": [group(apis=["infer"])]}, "server.restricted_apis.0.apis.0: Input should be 'health'"),
        ({"restricted_apis": [group(protocol="https")]}, "server.restricted_apis.0.protocol: Input should be 'http'"),
        ({"restricted_apis": [group(header="Api-Key")]}, "server.restricted_apis.0.header: String should match"),
        ({"restricted_apis": [group(header="k=v")]}, "server.restricted_apis.0.header: String should match"),
        ({"restricted_apis": [group(value=None)]}, "server.restricted_apis.0: give exactly one of value_env"),
        ({"restricted_apis": [group(value_env="V")]}, "server.restricted_apis.0: give exactly one of value_env"),
        ({"restricted_apis": [group(value=None, value_env="1BAD")]}, "server.restricted_apis.0.value_env: String"),
        ({"restricted_apis": [group(value=" v")]}, "server.restricted_apis.0: value must not begin or end with a"),
        ({"restricted_apis": [group(value="")]}, "server.restricted_apis.0: value is empty"),
        ({"restricted_apis": [group(value="é")]}, "server.restricted_apis.0: value must be printable ASCII"),
        ({"restricted_apis": [group(apis=[])]}, "server.restricted_apis.0.apis: List should have at least 1 item"),
        ({"restricted_apis": [group(apis=["trace", "trace"])]}, "server.restricted_apis.0: apis names ['trace'] twice"),
        ({"restricted_apis": [group(protocol="http"), group(protocol="http", apis=["metadata", "inference"])]},
         "server: restricted_apis.1: http api 'inference' is already in restricted_apis.0"),
        ({"extra_flags": [{"flag": "grpc-port", "value": 1}]}, "server.extra_flags.0.flag: String should match"),
        ({"extra_flags": [{"flag": "--id", "value": {"a": 1}}]}, "server.extra_flags.0.value"),
    ],
)  # fmt: skip
def test_the_schema_refuses_naming_the_key(server, message):
    assert message in refusal(**server)


def test_one_api_may_be_restricted_over_both_protocols():
    profile = profile_with(restricted_apis=[group(protocol="http"), group(protocol="grpc")])
    assert len(profile.server.restricted_apis) == 2


def test_tls_paths_are_relative_to_the_profiles_folder(tmp_path):
    data = copy.deepcopy(EMBEDDED)
    data["server"] = {"tls": {"cert": "certs/server.pem", "key": "/abs/server.key", "server_name": "llm.example"}}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data))
    tls = load_profile(tmp_path / "p.yaml").server.tls
    assert tls is not None
    assert (tls.cert, tls.key, tls.server_name) == (
        str(tmp_path / "certs/server.pem"),
        "/abs/server.key",
        "llm.example",
    )


# --- what the bundle's own clients send ----------------------------------------------------------------
def test_the_bundles_clients_trust_the_servers_certificate_and_send_its_keys(pem):
    profile = profile_with(
        tls={"cert": pem["cert"], "key": pem["key"], "server_name": "llm.example"},
        restricted_apis=[
            {"protocol": "grpc", "apis": ["inference"], "header": "api-key", "value_env": "INFERENCE_KEY"},
            {"protocol": "grpc", "apis": ["model-config"], "header": "admin", "value": "root"},
            {"protocol": "http", "apis": ["inference"], "header": "x-api-key", "value": "h"},
        ],
    )
    server = profile.server
    assert client_tls(server) == {"tls": True, "root_cert": pem["cert"], "cert": None, "key": None,
                                  "server_name": "llm.example"}  # fmt: skip
    assert client_headers(server, "grpc", ENV) == {f"{GRPC_HEADER_PREFIX}api-key": "s3cret",
                                                   f"{GRPC_HEADER_PREFIX}admin": "root"}  # fmt: skip
    assert client_headers(server, "http", ENV) == {"x-api-key": "h"}
    argv, env = frontend_access(server, ENV)
    assert argv == [f"--triton-root-cert={pem['cert']}", "--triton-server-name=llm.example"]
    assert json.loads(env[HEADERS_ENV]) == client_headers(server, "grpc", ENV)  # the secret stays off its argv
    assert not any("s3cret" in arg for arg in argv)
    with pytest.raises(ProfileError, match=r"server.restricted_apis.0.value_env: the environment variable"):
        client_headers(server, "grpc", {})
    # the edge checks gRPC inference's header on a stream (edge.py): that group's, not the others'
    assert json.loads(stream_key(server, ENV)[STREAM_KEY_ENV]) == [f"{GRPC_HEADER_PREFIX}api-key", "s3cret"]
    others = [{"protocol": "http", "apis": ["inference"], "header": "x-api-key", "value": "h"},
              {"protocol": "grpc", "apis": ["model-config"], "header": "admin", "value": "root"}]  # fmt: skip
    assert stream_key(profile_with(restricted_apis=others).server, ENV) == {}


def test_under_mutual_tls_the_bundles_clients_present_their_certificate(pem):
    server = profile_with(tls=pem).server
    assert client_tls(server) == {"tls": True, "root_cert": pem["ca_cert"], "cert": pem["client_cert"],
                                  "key": pem["client_key"], "server_name": None}  # fmt: skip
    assert frontend_access(server, {}) == (
        [f"--triton-root-cert={pem['ca_cert']}", f"--triton-cert={pem['client_cert']}",
         f"--triton-key={pem['client_key']}"],
        {},
    )  # fmt: skip
    assert frontend_access(load_profile().server, {}) == ([], {})
