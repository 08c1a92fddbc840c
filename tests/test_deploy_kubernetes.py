"""The Kubernetes example: vLLM + sidecar in one pod, scrape annotations, the store as its own Deployment."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [
    doc
    for path in sorted((ROOT / "deploy/kubernetes").glob("*.yaml"))
    for doc in yaml.safe_load_all(path.read_text())
    if doc
]


def _find(kind: str, name: str) -> dict:
    matches = [doc for doc in DOCUMENTS if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def _containers(deployment: dict) -> dict[str, dict]:
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}


def _arg(container: dict, flag: str) -> str:
    args = container["args"]
    return args[args.index(flag) + 1]


def test_sidecar_runs_beside_vllm_in_the_same_pod():
    containers = _containers(_find("Deployment", "llm-inference"))
    assert set(containers) == {"vllm", "headroom"}
    assert containers["vllm"]["image"].startswith("vllm/vllm-openai:")
    sidecar = containers["headroom"]
    assert sidecar["args"][0] == "run"
    vllm_port = _arg(containers["vllm"], "--port")
    assert _arg(sidecar, "--upstream") == f"http://127.0.0.1:{vllm_port}"
    assert _arg(sidecar, "--engine-metrics-url") == f"http://127.0.0.1:{vllm_port}/metrics"


def test_pod_carries_scrape_annotations_for_the_sidecar_port():
    deployment = _find("Deployment", "llm-inference")
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    sidecar = _containers(deployment)["headroom"]
    listen_port = int(_arg(sidecar, "--listen").rsplit(":", 1)[1])
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == listen_port
    assert annotations["prometheus.io/path"] == "/metrics"
    assert {p["containerPort"] for p in sidecar["ports"]} == {listen_port}


def test_clients_reach_the_sidecar_not_the_engine_directly():
    service = _find("Service", "llm-inference")
    (port,) = service["spec"]["ports"]
    sidecar = _containers(_find("Deployment", "llm-inference"))["headroom"]
    assert port["targetPort"] in {p["name"] for p in sidecar["ports"]}
    assert _arg(_containers(_find("Deployment", "llm-inference"))["vllm"], "--host") == "127.0.0.1"


def test_store_is_its_own_single_writer_deployment_with_a_service():
    store = _find("Deployment", "headroom-store")
    assert store["spec"]["replicas"] == 1
    assert store["spec"]["strategy"]["type"] == "Recreate", "two DuckDB writers during a rollout"
    (container,) = _containers(store).values()
    assert container["args"][0] == "store"
    service = _find("Service", "headroom-store")
    service_port = service["spec"]["ports"][0]["port"]
    sidecar = _containers(_find("Deployment", "llm-inference"))["headroom"]
    assert _arg(sidecar, "--store-url") == f"http://headroom-store:{service_port}"
    volumes = store["spec"]["template"]["spec"]["volumes"]
    assert any("persistentVolumeClaim" in volume for volume in volumes)


def test_tokens_come_from_a_secret_never_from_a_literal():
    token_envs = []
    for doc in DOCUMENTS:
        if doc["kind"] != "Deployment":
            continue
        for container in _containers(doc).values():
            for env in container.get("env", []):
                if "TOKEN" in env["name"]:
                    assert "value" not in env, f"{env['name']} has a literal value"
                    token_envs.append(env["valueFrom"]["secretKeyRef"]["name"])
    assert token_envs.count("headroom-store-token") == 2  # the store checks it, the sidecar sends it
    assert not [doc for doc in DOCUMENTS if doc["kind"] == "Secret"], "never commit a Secret"
