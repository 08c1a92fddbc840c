"""`headroom run`'s options: each declared once, with SidecarConfig's default, and each reaching it."""

from __future__ import annotations

import dataclasses

import click
import pytest
from support.clickopts import passed_options

from collector.sidecar.cli import run
from collector.sidecar.config import SidecarConfig
from collector.sidecar.options import NOT_CONFIG, RENAMED, config_from_options

FIELDS = {f.name: f for f in dataclasses.fields(SidecarConfig)}
OPTIONS = [p for p in run.params if isinstance(p, click.Option)]


def _defaults(**given: object) -> dict[str, object]:
    """What click passes `run` with only --upstream on the command line, updated by `given`."""
    return passed_options(run, ["--upstream", "http://127.0.0.1:8000"], **given)


@pytest.mark.parametrize("option", [p for p in OPTIONS if p.name not in NOT_CONFIG], ids=lambda p: p.name)
def test_every_option_is_a_config_field_with_the_configs_default(option):
    field = FIELDS.get(RENAMED.get(option.name, option.name))
    assert field is not None, f"--{option.name} reaches no SidecarConfig field"
    if field.default is not dataclasses.MISSING and option.name != "upstream":
        given = _defaults()[option.name]  # what click passes when the option is not given
        default = tuple(given) if option.multiple else given
        assert default == field.default, f"--{option.name}: {default!r} here, {field.default!r} in the config"


def test_the_defaults_make_the_configs_defaults():
    config = config_from_options(_defaults())
    expected = SidecarConfig(upstream="http://127.0.0.1:8000", instance=config.instance)
    assert config == expected


def test_options_reach_the_config_renamed_and_parsed():
    config = config_from_options(
        _defaults(
            listen="0.0.0.0:9200",
            admin_listen="127.0.0.1:9201",
            read_timeout=30.0,
            adapters=("sql-lora=llama",),
            probe_dbs=["a.duckdb"],
            lake="/tmp/lake",
        )
    )
    assert (config.listen_host, config.listen_port, config.admin_listen) == (
        "0.0.0.0",
        9200,
        ("127.0.0.1", 9201),
    )
    assert config.read_timeout_s == 30.0 and config.adapters == {"sql-lora": "llama"}
    assert config.probe_dbs == ("a.duckdb",) and config.db_path is None  # --lake instead of --db


def test_a_bad_listen_address_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="admin-listen"):
        config_from_options(_defaults(admin_listen="nowhere"))


def test_the_latency_slo_reaches_the_stores_jobs():
    """`--slo-ttft-p95` is what the refresh estimates probe runs and traffic against (their
    SLO-bound concurrency and μ_slo) and what the weekly review judges; 0 or less is refused."""
    from collector.sidecar.wiring import job_settings

    config = config_from_options(_defaults(slo_ttft_p95=2.5))
    assert config.slo_ttft_p95_s == 2.5 and job_settings(config).slo_ttft_p95_s == 2.5
    assert job_settings(config_from_options(_defaults())).slo_ttft_p95_s is None
    with pytest.raises(click.BadParameter, match="0.0<x|0<x|range"):
        run.main(["--upstream", "http://127.0.0.1:8000", "--slo-ttft-p95", "0"], standalone_mode=False)
