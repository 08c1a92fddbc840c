"""The Kubernetes example becomes Ready and is scraped under the job the alerts select.

Every manifest is checked against the Kubernetes API schemas (kubernetes-validate, strict); the
custom resources (PodMonitor, PrometheusRule, ScaledObject) have no schema installable here, so
their fields are checked against the operators' documented ones and against our generators.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from starlette.testclient import TestClient
from support.waiting import patient

from collector.alerts.files import ALERTS_FILE, rule_files
from collector.capacity import CapacityEstimate
from collector.cli import main
from collector.integrations.kubernetes import prometheus_rule
from collector.integrations.render import keda_scaled_object
from collector.rules.config import DEFAULT
from collector.sidecar.wiring import sidecar_state

ROOT = Path(__file__).resolve().parent.parent
KUBE = ROOT / "deploy/kubernetes"
DOCUMENTS = [
    doc for path in sorted(KUBE.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc
]
CUSTOM_KINDS = {"PodMonitor", "PrometheusRule", "ScaledObject"}
KUBERNETES_VERSION = "1.33.0"


def _find(kind: str, name: str) -> dict:
    matches = [doc for doc in DOCUMENTS if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def _containers(deployment: dict) -> dict[str, dict]:
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}


def _arg(container: dict, flag: str) -> str:
    args = container["args"]
    return args[args.index(flag) + 1]


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


@pytest.mark.parametrize(
    "doc",
    [d for d in DOCUMENTS if d["kind"] not in CUSTOM_KINDS],
    ids=lambda d: f"{d['kind']}/{d['metadata']['name']}",
)
def test_every_core_manifest_validates_against_the_kubernetes_schema(doc):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_a_bad_manifest_is_rejected_by_the_validator():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    broken = json.loads(json.dumps(_find("Deployment", "llm-inference")))
    broken["spec"]["template"]["spec"]["containers"][1]["readinessProbe"]["httpGet"]["port"] = [9100]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_probes_reach_what_they_probe():
    containers = _containers(_find("Deployment", "llm-inference"))
    vllm, sidecar = containers["vllm"], containers["headroom"]
    assert _arg(vllm, "--host") == "127.0.0.1", "the engine stays private to the pod"
    for probe in ("startupProbe", "livenessProbe"):
        # the kubelet dials the pod IP: a loopback-bound engine is probed from inside its container
        assert "httpGet" not in vllm[probe] and "tcpSocket" not in vllm[probe]
        assert "http://127.0.0.1:8000/health" in " ".join(vllm[probe]["exec"]["command"])
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert _arg(sidecar, "--listen").startswith("0.0.0.0:"), "the sidecar must answer on the pod IP"
    assert _arg(sidecar, "--admin-listen").startswith("0.0.0.0:"), "the kubelet dials the pod IP"
    from collector.serving import parse_listen
    from collector.sidecar.config import SidecarConfig
    from collector.sidecar.wiring import build_sidecar

    admin = parse_listen(_arg(sidecar, "--admin-listen"))
    app = build_sidecar(
        SidecarConfig(
            upstream="http://127.0.0.1:1", engine="none", db_path=None, jobs=False, admin_listen=admin
        )
    )
    admin_port, proxy_port = TestClient(sidecar_state(app).admin.app), TestClient(app)
    for path in ("/healthz", "/metrics"):
        assert admin_port.get(path).status_code == 200 and proxy_port.get(path).status_code == 404, path


def test_the_service_exposes_only_the_proxy_and_prometheus_scrapes_the_admin_port():
    sidecar = _containers(_find("Deployment", "llm-inference"))["headroom"]
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    assert ports["http"] == int(_arg(sidecar, "--listen").rpartition(":")[2])
    assert ports["admin"] == int(_arg(sidecar, "--admin-listen").rpartition(":")[2])
    service = _find("Service", "llm-inference")["spec"]["ports"]
    assert [p["targetPort"] for p in service] == ["http"], "metrics and the request log stay off the Service"
    template = _find("Deployment", "llm-inference")["spec"]["template"]["metadata"]
    assert template["annotations"]["prometheus.io/port"] == str(ports["admin"])
    assert _find("PodMonitor", "llm-headroom")["spec"]["podMetricsEndpoints"][0]["port"] == "admin"


def test_read_only_containers_have_scratch_and_the_sidecar_sees_the_gpu():
    for deployment in ("llm-inference", "headroom-lake-committer"):
        doc = _find("Deployment", deployment)
        volumes = {v["name"]: v for v in doc["spec"]["template"]["spec"]["volumes"]}
        for container in _containers(doc).values():
            if not container["image"].startswith("llm-headroom"):
                continue
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert "emptyDir" in volumes[mounts["/tmp"]], f"{deployment}: no writable /tmp"
            assert _env(container)["MPLCONFIGDIR"].startswith("/tmp/") and _env(container)["TMPDIR"] == "/tmp"
    sidecar = _containers(_find("Deployment", "llm-inference"))["headroom"]
    assert _env(sidecar)["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert _env(sidecar)["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert "nvidia.com/gpu" not in sidecar["resources"].get("limits", {}), "the sidecar must not take a GPU"


def test_disruption_budget_and_autoscaler_target_the_inference_pods():
    deployment = _find("Deployment", "llm-inference")
    pods = deployment["spec"]["template"]["metadata"]["labels"]
    pdb = _find("PodDisruptionBudget", "llm-inference")
    assert (
        pdb["spec"]["selector"]["matchLabels"].items() <= pods.items() and pdb["spec"]["maxUnavailable"] == 1
    )
    scaled = _find("ScaledObject", "llm-inference-headroom")
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    estimate = CapacityEstimate.from_dict(json.loads((KUBE / "example-estimate.json").read_text()))
    rendered = keda_scaled_object(estimate, deployment="llm-inference", min_replicas=2)
    assert scaled == rendered, (
        "keda-scaledobject.yaml is stale: rerender it from example-estimate.json "
        "(headroom integrations keda --estimate ... --min-replicas 2)"
    )


def test_prometheus_rule_is_rendered_from_the_same_rule_files():
    committed = (KUBE / "prometheusrule.yaml").read_text()
    result = CliRunner().invoke(main, ["integrations", "prometheusrule"])
    assert result.exit_code == 0 and result.output == committed, (
        "deploy/kubernetes/prometheusrule.yaml is stale: run `make generate`"
    )
    groups = [g for text in rule_files().values() for g in yaml.safe_load(text)["groups"]]
    rule = yaml.safe_load(committed)
    assert rule == prometheus_rule(rule_files())
    assert sorted(g["name"] for g in rule["spec"]["groups"]) == sorted(g["name"] for g in groups)


# --- one job selector ------------------------------------------------------------------------------


def _alert_jobs() -> set[str]:
    text = rule_files()[ALERTS_FILE]
    return set(re.findall(r'job="([^"]+)"', text))


def _relabel(rules: list[dict], labels: dict[str, str]) -> dict[str, str] | None:
    """Prometheus relabeling (keep and replace, the actions the documented job uses) on one target."""
    labels = dict(labels)
    for rule in rules:
        value = rule.get("separator", ";").join(
            labels.get(name, "") for name in rule.get("source_labels", [])
        )
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        action = rule.get("action", "replace")
        if action == "keep":
            if not match:
                return None
        elif action == "replace" and match:
            replacement = match.expand(re.sub(r"\$(\d+)", r"\\g<\1>", rule.get("replacement", "$1")))
            labels[rule["target_label"]] = replacement
        elif action not in ("replace", "keep"):
            raise AssertionError(f"the test does not simulate relabel action {action}")
    return labels


def _documented_scrape_job() -> dict:
    text = (ROOT / "docs/operations.md").read_text()
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)]
    (job,) = [b[0] for b in blocks if isinstance(b, list) and b and "kubernetes_sd_configs" in b[0]]
    return job


def _pod_meta(deployment: dict) -> dict[str, str]:
    template = deployment["spec"]["template"]["metadata"]
    meta = {
        "__address__": "10.0.0.7:9100",
        "job": "llm-headroom",
        "__meta_kubernetes_namespace": "llm",
        "__meta_kubernetes_pod_name": "llm-inference-5d9f",
    }
    for key, value in template["labels"].items():
        meta["__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)] = value
    for key, value in template.get("annotations", {}).items():
        meta["__meta_kubernetes_pod_annotation_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)] = value
    return meta


def test_rules_podmonitor_and_documented_scrape_config_agree_on_the_sidecar_job():
    assert _alert_jobs() == {DEFAULT.sidecar_job}, "alerts select another job than RulesConfig.sidecar_job"
    inference = _find("Deployment", "llm-inference")
    pod_labels = inference["spec"]["template"]["metadata"]["labels"]
    monitor = _find("PodMonitor", "llm-headroom")
    # the Operator names the job after the jobLabel's value on the pod
    assert pod_labels[monitor["spec"]["jobLabel"]] == DEFAULT.sidecar_job
    (selects,) = monitor["spec"]["selector"]["matchExpressions"]
    assert selects == {"key": monitor["spec"]["jobLabel"], "operator": "Exists"}
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] in {
        p["name"] for p in _containers(inference)["headroom"]["ports"]
    }
    target = _relabel(_documented_scrape_job()["relabel_configs"], _pod_meta(inference))
    assert target is not None, "the documented scrape config drops the inference pod"
    assert target["job"] == DEFAULT.sidecar_job
    assert target["__address__"] == "10.0.0.7:9101" and target["__metrics_path__"] == "/metrics"
    assert (target["namespace"], target["pod"]) == ("llm", "llm-inference-5d9f")
    committer = _pod_meta(_find("Deployment", "headroom-lake-committer"))
    assert _relabel(_documented_scrape_job()["relabel_configs"], committer) is None, "not a sidecar"


@pytest.mark.subprocess
def test_documented_relabeling_loads_in_promtool(tmp_path):
    """promtool checks the relabel rules; Debian's build has no Kubernetes discovery, so the
    discovery block is swapped for a static target (the relabeling is what this test is about)."""
    import subprocess

    from conftest import require_tool

    promtool = require_tool("promtool")
    job = _documented_scrape_job()
    job.pop("kubernetes_sd_configs")
    job["static_configs"] = [{"targets": ["127.0.0.1:9100"]}]
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"scrape_configs": [job]}))
    result = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=patient(60)
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_catalog_comes_from_a_secret_never_from_a_literal():
    secret_envs = []
    for doc in DOCUMENTS:
        spec = doc.get("spec", {})
        pod = spec.get("jobTemplate", {}).get("spec", spec)
        for container in pod.get("template", {}).get("spec", {}).get("containers", []):
            for env in container.get("env", []):
                if "TOKEN" in env["name"] or "CATALOG" in env["name"]:
                    assert "value" not in env, f"{env['name']} has a literal value"
                    secret_envs.append(env["valueFrom"]["secretKeyRef"]["name"])
    assert secret_envs.count("headroom-catalog") == 2  # the committer and the maintenance
    assert not [doc for doc in DOCUMENTS if doc["kind"] == "Secret"], "never commit a Secret"


def test_sidecars_stage_into_the_lake_the_committer_and_maintenance_read():
    sidecar = _containers(_find("Deployment", "llm-inference"))["headroom"]
    committer = _containers(_find("Deployment", "headroom-lake-committer"))["committer"]
    (maintain,) = _find("CronJob", "headroom-lake-maintain")["spec"]["jobTemplate"]["spec"]["template"][
        "spec"
    ]["containers"]
    assert _arg(sidecar, "--lake") == _arg(committer, "--lake") == _arg(maintain, "--lake")
    assert committer["args"][:2] == ["lake", "commit"] and maintain["args"][:2] == ["lake", "maintain"]
    assert "--store-url" not in sidecar["args"] and "--db" not in sidecar["args"]
    assert (
        _arg(sidecar, "--upstream")
        == f"http://127.0.0.1:{_arg(_containers(_find('Deployment', 'llm-inference'))['vllm'], '--port')}"
    )
