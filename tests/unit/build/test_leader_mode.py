"""Leader mode: a target engine whose ranks span the nodes of a LeaderWorkerSet group. The argv
the leader runs is checked against the upstream record (specdec/build/upstream.py): the shape of
launch_triton_server.py's command per rank, the environment that keeps the backend in leader mode,
and the pod names LWS gives a group."""

from __future__ import annotations

import pytest
from support.trtllm import profile_data

from specdec.build import trtllm as t
from specdec.build import upstream
from specdec.config import ProfileError, parse_profile

SERVER = ["/opt/tritonserver/bin/tritonserver", "--model-repository=/engines/p/model_repository",
          "--model-control-mode=none", "--disable-auto-complete-config", "--log-verbose=0"]  # fmt: skip
# what LWS puts in a group's containers: group 3 of the LeaderWorkerSet "specdec" in namespace "ml"
GROUP_ENV = {upstream.LWS_LEADER_ADDRESS: "specdec-3.specdec.ml", upstream.LWS_GROUP_SIZE: "2"}


def multinode(mode: str = "ngram", nodes: int = 2, gpu_ids: tuple[int, ...] = (0, 1), **target):
    data = profile_data(mode)
    placement = {"tp_size": nodes * len(gpu_ids), "pp_size": 1, "gpu_ids": list(gpu_ids), "nodes": nodes}
    data["trtllm"]["target"] = {**data["trtllm"]["target"], **placement, **target}
    return parse_profile(data, f"{mode}-{nodes}node")


def ranks(argv: list[str]) -> list[list[str]]:
    """The per-rank parts of an MPMD mpirun command line, after its own options."""
    first = argv.index("-n")
    parts, part = [], []
    for arg in argv[first:]:
        if arg == ":":
            parts.append(part)
            part = []
        else:
            part.append(arg)
    return [*parts, part]


def test_the_leader_runs_one_mpirun_over_the_group():
    profile = multinode()
    env = {**GROUP_ENV, "TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1", "PATH": "/bin"}
    argv, environment = t.launch_command(profile, SERVER, env)
    assert argv[: len(upstream.LEADER_MPIRUN)] == list(upstream.LEADER_MPIRUN)
    # the group's pods as LWS names them, the leader first, each with its node's GPUs as slots
    hosts = argv[argv.index("--host") + 1]
    assert hosts == "specdec-3:2,specdec-3-1:2"
    assert "-mca" not in argv  # no agent given: mpirun's own
    # leader mode: the orchestrator's switches gone (set only with --multi-model upstream)
    assert not set(upstream.ORCHESTRATOR_ENV) & set(environment)
    assert environment["PATH"] == "/bin" and environment[upstream.LWS_LEADER_ADDRESS] == "specdec-3.specdec.ml"


def test_each_rank_is_a_tritonserver_as_upstream_starts_it():
    profile = multinode()
    argv, _ = t.launch_command(profile, SERVER, {**GROUP_ENV, t.RSH_AGENT_ENV: "/opt/agent"})
    assert argv[argv.index("-mca") : argv.index("-mca") + 3] == [*upstream.MPI_RSH_AGENT_PARAM, "/opt/agent"]
    parts = ranks(argv)
    assert len(parts) == profile.trtllm.target.tp_size * profile.trtllm.target.pp_size == 4
    engines = [name for name, (template, _) in t.engine_models(profile).items() if template.name == "engine"]
    assert engines == ["target"]
    for rank, part in enumerate(parts):
        assert part[:3] == ["-n", "1", SERVER[0]] and part[3] == SERVER[1]  # then --model-repository
        shm = upstream.LEADER_RANK_FLAGS[1].format(rank)
        assert part.count(shm) == 1 and part.count("--disable-auto-complete-config") == 1
        if rank == 0:  # the server specdec serve runs, which serves every model
            assert part[2:] == [*SERVER, shm]
        else:  # only the engine models, loaded explicitly
            assert not any(
                a.startswith("--model-control-mode=") and a not in upstream.LEADER_WORKER_FLAGS for a in part
            )
            assert set(upstream.LEADER_WORKER_FLAGS) <= set(part)
            assert [a for a in part if a.startswith("--load-model=")] == ["--load-model=target"]
            assert [a for a in part if a.startswith("--load-model=")] == [
                upstream.LEADER_LOAD_MODEL.format(name) for name in engines
            ]


def test_pods_of_a_group_follow_lws_names():
    group = t.Group.from_env({upstream.LWS_LEADER_ADDRESS: "my-lws-12.my-lws.default", upstream.LWS_GROUP_SIZE: "4"})
    assert group.hosts() == ["my-lws-12", "my-lws-12-1", "my-lws-12-2", "my-lws-12-3"]


@pytest.mark.parametrize(
    "env",
    [{}, {upstream.LWS_LEADER_ADDRESS: "specdec-0.specdec.ml"}, {**GROUP_ENV, upstream.LWS_GROUP_SIZE: "two"}],
)
def test_outside_a_group_the_leader_refuses(env):
    with pytest.raises(ProfileError, match="LeaderWorkerSet"):
        t.launch_command(multinode(), SERVER, env)


def test_the_group_must_have_the_targets_nodes():
    with pytest.raises(ProfileError, match=r"target\.nodes is 2 but the LeaderWorkerSet group has 3 pods"):
        t.launch_command(multinode(), SERVER, {**GROUP_ENV, upstream.LWS_GROUP_SIZE: "3"})


def test_one_node_stays_in_orchestrator_mode():
    argv, env = t.launch_command(multinode(nodes=1), SERVER, GROUP_ENV)
    assert argv[:3] == ["mpirun", "-n", "1"] and env["TRTLLM_ORCHESTRATOR"] == "1"


def test_profiles_place_every_rank_on_a_node():
    multinode(nodes=4, gpu_ids=(0, 1, 2, 3))  # 16 ranks on 4 nodes
    with pytest.raises(ProfileError, match=r"tp_size \* pp_size = 6 GPUs, but gpu_ids names 2 .* on each of 2 nodes"):
        multinode(tp_size=6)
    with pytest.raises(ProfileError, match="leader mode"):
        multinode("draft-target")  # a second tensorrt_llm model would span the whole world too
    with pytest.raises(ProfileError, match="leader mode"):
        multinode("eagle3")
    data = profile_data("draft-target")
    data["trtllm"]["draft"] |= {"nodes": 2, "tp_size": 2}
    with pytest.raises(ProfileError, match=r"draft\.nodes must be 1"):
        parse_profile(data, "draft-on-two-nodes")


def test_the_facts_say_where_they_were_read():
    facts = [v for k, v in vars(upstream).items() if k.startswith(("LEADER_", "LWS_", "MULTI_MODEL", "RANK_DEVICE"))]
    wheres = [w for v in facts for w in (v if isinstance(v, tuple) else (v,)) if isinstance(w, upstream.Where)]
    assert len(wheres) >= 15
    for where in wheres:
        assert where.repo and where.path and where.ref and where.lines, where
    assert {w.ref for w in wheres if w.repo == upstream.LWS_REPO} == {upstream.LWS_TAG}
