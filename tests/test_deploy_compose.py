"""docker-compose.yml and what it mounts: paths exist, loopback ports, volumes, health, secrets, wiring."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from support.waiting import patient

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
ALWAYS_ON = sorted(name for name, service in SERVICES.items() if not service.get("profiles"))
PROMETHEUS = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
DATASOURCES = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/headroom.yml").read_text())[
    "datasources"
]
SECRET_NAME = re.compile(r"TOKEN|PASSWORD|SECRET|API_KEY", re.IGNORECASE)
DATASOURCE_UID = "headroom-prometheus"


def _bind_mounts() -> list[tuple[str, str, str]]:
    """(service, host path, container path) of every bind mount (a volume entry starting with '.')."""
    mounts = []
    for name, service in SERVICES.items():
        for entry in service.get("volumes", []):
            source, target = entry.split(":")[:2]
            if source.startswith("."):
                mounts.append((name, source, target))
    return mounts


def _targets(job_name: str) -> list[str]:
    (job,) = [job for job in PROMETHEUS["scrape_configs"] if job["job_name"] == job_name]
    return [target for config in job["static_configs"] for target in config["targets"]]


def test_the_whole_pipeline_is_there_with_gpu_profiles():
    assert set(ALWAYS_ON) == {"sim", "sidecar", "prometheus", "alertmanager", "grafana"}
    assert SERVICES["vllm"]["profiles"] == ["vllm"]
    assert SERVICES["dcgm-exporter"]["profiles"] == ["dcgm"]


@pytest.mark.parametrize(("service", "source", "target"), _bind_mounts())
def test_every_mounted_path_exists(service, source, target):
    path = ROOT / source
    assert path.exists(), f"{service} mounts {source} at {target}, but {path} does not exist"


def test_prometheus_and_grafana_mount_the_generated_rules_and_dashboards():
    mounts = {(service, source) for service, source, _ in _bind_mounts()}
    assert ("prometheus", "./deploy/prometheus/prometheus.yml") in mounts
    assert ("prometheus", "./alerts") in mounts
    assert ("alertmanager", "./alerts/alertmanager.yml") in mounts
    assert ("grafana", "./dashboards") in mounts
    assert ("grafana", "./deploy/grafana/provisioning") in mounts


def test_published_ports_are_bound_to_loopback():
    published = [(name, port) for name, service in SERVICES.items() for port in service.get("ports", [])]
    assert published, "the compose file publishes no port at all"
    for name, port in published:
        assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"


def test_duckdb_and_prometheus_data_live_in_named_volumes():
    named = set(COMPOSE["volumes"])
    sidecar_command = SERVICES["sidecar"]["command"]
    db_dir = str(Path(sidecar_command[sidecar_command.index("--db") + 1]).parent)
    store_volumes = dict(entry.split(":")[:2][::-1] for entry in SERVICES["sidecar"]["volumes"])
    assert store_volumes.get(db_dir) in named, f"the DuckDB directory {db_dir} is not a named volume"
    prometheus_volumes = dict(entry.split(":")[:2][::-1] for entry in SERVICES["prometheus"]["volumes"])
    assert prometheus_volumes.get("/prometheus") in named


def test_every_always_on_service_has_a_healthcheck():
    for name in ALWAYS_ON:
        test = SERVICES[name].get("healthcheck", {}).get("test")
        assert test and test[0] == "CMD", f"{name} has no exec-form healthcheck"


def test_secrets_come_from_the_environment_never_literal():
    for name, service in SERVICES.items():
        for key, value in (service.get("environment") or {}).items():
            if SECRET_NAME.search(key):
                assert re.fullmatch(r"\$\{[A-Z_]+:[?-][^}]*\}", str(value)), (
                    f"{name}.{key} must be an ${{VAR:?...}} reference, not a value"
                )
    text = (ROOT / "docker-compose.yml").read_text()
    assert "${HEADROOM_TOKEN:?" in text, "the owner routes' token must be required from the environment"
    assert "--token" not in text, "a token on the command line is visible in `ps`; use the env"


def test_dockerfile_runs_as_non_root_with_headroom_entrypoint():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^USER (?!root|0\b)\S+", dockerfile, re.MULTILINE)
    assert 'ENTRYPOINT ["headroom"]' in dockerfile
    assert not SECRET_NAME.search(re.sub(r"#.*", "", dockerfile)), "the Dockerfile mentions a secret"


def test_dockerfile_copies_only_what_exists_and_is_not_ignored():
    import fnmatch
    import tomllib

    ignored = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copies = re.findall(r"^COPY (?!--from)(.+) \S+$", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    sources = [source for line in copies for source in line.split()]
    assert "pyproject.toml" in sources and "collector" in sources
    readme = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["readme"]
    assert any(fnmatch.fnmatch(readme, source) for source in sources), f"{readme} is not copied"
    for source in sources:
        assert "*" in source or (ROOT / source).exists(), f"the Dockerfile copies missing {source}"
        assert not any(fnmatch.fnmatch(source, pattern) for pattern in ignored), (
            f".dockerignore hides {source} from the build"
        )


def test_prometheus_scrapes_the_sidecar_where_compose_serves_it():
    sidecar = SERVICES["sidecar"]["command"]
    sidecar_port = sidecar[sidecar.index("--listen") + 1].rsplit(":", 1)[1]
    assert _targets("headroom-sidecar") == [f"sidecar:{sidecar_port}"]
    assert "store" not in SERVICES and "headroom-store" not in str(PROMETHEUS)
    (alertmanagers,) = PROMETHEUS["alerting"]["alertmanagers"]
    assert alertmanagers["static_configs"][0]["targets"] == ["alertmanager:9093"]
    assert "alertmanager" in SERVICES


def test_rule_files_resolve_inside_the_mounted_alerts_directory():
    prometheus_mounts = dict(entry.split(":")[:2] for entry in SERVICES["prometheus"]["volumes"])
    config_dir = Path(prometheus_mounts["./deploy/prometheus/prometheus.yml"]).parent
    assert Path(prometheus_mounts["./alerts"]) == config_dir / "alerts"
    for pattern in PROMETHEUS["rule_files"]:
        assert pattern.startswith("alerts/")
        assert sorted(ROOT.glob(pattern)), f"rule_files {pattern} matches nothing in the repository"


def test_sidecar_points_at_the_engine_and_owns_its_log_on_a_volume():
    command = SERVICES["sidecar"]["command"]
    assert command[command.index("--upstream") + 1] == "${HEADROOM_UPSTREAM:-http://sim:8000}"
    sim_listen = SERVICES["sim"]["command"][SERVICES["sim"]["command"].index("--listen") + 1]
    assert sim_listen.endswith(":8000")
    assert "--store-url" not in command and command[command.index("--db") + 1].startswith("/data/db/")


def _dashboard_datasource_uids() -> set[str]:
    """Datasource uids the dashboards select: literal uids, and the default of `${var}` variables."""
    uids: set[str] = set()

    def walk(node, variables: dict[str, str]) -> None:
        if isinstance(node, dict):
            source = node.get("datasource")
            if isinstance(source, dict) and isinstance(source.get("uid"), str):
                uid = source["uid"]
                name = uid.strip("${}") if uid.startswith("$") else None
                assert name is None or name in variables, f"datasource variable {uid} is not defined"
                uids.add(variables[name] if name else uid)
            for value in node.values():
                walk(value, variables)
        elif isinstance(node, list):
            for value in node:
                walk(value, variables)

    for path in sorted((ROOT / "dashboards").glob("*.json")):
        board = json.loads(path.read_text())
        variables = {
            v["name"]: v["current"]["value"]
            for v in board.get("templating", {}).get("list", [])
            if v.get("type") == "datasource"
        }
        walk(board, variables)
    return uids


def test_grafana_datasource_has_the_fixed_uid_the_dashboards_use():
    (datasource,) = DATASOURCES
    assert datasource["uid"] == DATASOURCE_UID
    assert datasource["url"] == "http://prometheus:9090"
    used = _dashboard_datasource_uids()
    assert used, "no generated dashboard in dashboards/ selects a datasource"
    assert used == {DATASOURCE_UID}, f"dashboards select datasource uids {used}"


def test_dashboards_provider_points_at_the_mounted_dashboards():
    provider_file = ROOT / "deploy/grafana/provisioning/dashboards/headroom.yml"
    (provider,) = yaml.safe_load(provider_file.read_text())["providers"]
    grafana_mounts = dict(entry.split(":")[:2] for entry in SERVICES["grafana"]["volumes"])
    assert provider["options"]["path"] == grafana_mounts["./dashboards"]


def _compose_plugin_works() -> bool:
    docker = shutil.which("docker")
    if docker is None:
        return False
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, timeout=patient(30))
    return probe.returncode == 0


@pytest.mark.subprocess
@pytest.mark.skipif(
    not _compose_plugin_works(),
    reason="the Docker compose plugin is not installed here (only the docker client)",
)
def test_docker_compose_config_accepts_the_file():
    env = os.environ | {"HEADROOM_TOKEN": "x" * 32, "GRAFANA_ADMIN_PASSWORD": "y" * 16}
    result = subprocess.run(
        ["docker", "compose", "--profile", "vllm", "--profile", "dcgm", "config", "-q"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=patient(60),
    )
    assert result.returncode == 0, result.stderr


def test_alerts_select_the_job_that_scrapes_the_sidecar():
    from collector.rules.config import DEFAULT

    assert DEFAULT.sidecar_job in {job["job_name"] for job in PROMETHEUS["scrape_configs"]}
    assert _targets(DEFAULT.sidecar_job) == ["sidecar:9100"]
