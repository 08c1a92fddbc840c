"""`headroom probe`'s options: each declared once, with ProbeSettings' default, and each reaching it."""

from __future__ import annotations

import dataclasses
import inspect

import click
import pytest
from support.clickopts import passed_options

from collector.analysis.cli import probe
from collector.analysis.estimate import estimate_from_probe
from collector.analysis.probe import ProbeSettings
from collector.analysis.probe_options import NOT_SETTINGS, PARSED, PROFILE, RENAMED, settings_from_options
from collector.analysis.recommend import PROFILES
from collector.capacity import Slo

URL = "http://127.0.0.1:8000"
FIELDS = {f.name: f for f in dataclasses.fields(ProbeSettings)}
OPTIONS = [p for p in probe.params if isinstance(p, click.Option)]
# the options whose value is a ProbeSettings field (--sidecar-token one the command sets itself)
SETTINGS_OPTIONS = [p for p in OPTIONS if (PARSED.get(p.name) or RENAMED.get(p.name, p.name)) in FIELDS]


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    for name in ("OPENAI_API_KEY", "HEADROOM_TOKEN", "HEADROOM_CATALOG"):
        monkeypatch.delenv(name, raising=False)


def _defaults(**given: object) -> dict[str, object]:
    """What click passes `probe` with only --url on the command line, updated by `given`."""
    return passed_options(probe, ["--url", URL], **given)


def _field_default(name: str) -> object:
    field = FIELDS[name]
    return field.default_factory() if field.default is dataclasses.MISSING else field.default


def test_every_option_is_a_setting_or_named_as_none():
    unplaced = [p.name for p in OPTIONS if p not in SETTINGS_OPTIONS and p.name not in NOT_SETTINGS]
    assert unplaced == [], f"options neither a ProbeSettings field nor in NOT_SETTINGS: {unplaced}"
    assert set(NOT_SETTINGS) <= {p.name for p in OPTIONS}, "NOT_SETTINGS names an option probe lacks"


@pytest.mark.parametrize("option", [p for p in SETTINGS_OPTIONS if p.name != "url"], ids=lambda p: p.name)
def test_every_option_has_the_settings_default(option):
    if option.name in PARSED:  # text parsed into the field: compare what the default makes
        field = PARSED[option.name]
        made = getattr(settings_from_options(_defaults()), field)
    else:
        field = RENAMED.get(option.name, option.name)
        made = _defaults()[option.name]  # what click passes when the option is not given
    assert made == _field_default(field), (
        f"--{option.name}: {made!r} here, {_field_default(field)!r} in ProbeSettings"
    )


def test_the_defaults_make_the_settings_defaults():
    assert settings_from_options(_defaults()) == ProbeSettings(url=URL)
    # the ladder's timings are set with --rates only; then they are the settings' too
    assert settings_from_options(_defaults(rates="auto")) == ProbeSettings(url=URL, rates_auto=True)


def test_the_profile_default_is_the_estimates():
    default = inspect.signature(estimate_from_probe).parameters["profile"].default
    assert _defaults()["profile"] == PROFILE == default
    (option,) = [p for p in OPTIONS if p.name == "profile"]
    assert isinstance(option.type, click.Choice) and list(option.type.choices) == list(PROFILES)


def test_options_reach_the_settings_renamed_and_parsed():
    settings = settings_from_options(
        _defaults(
            levels="8,2,4,2",
            max_tokens=64,
            timeout_s=9.0,
            max_level_seconds=3.0,
            slo_ttft_p95=2.0,
            slo_tpot_p95=0.1,
            adapters="sql-lora, chat-lora,sql-lora",
            rates="1,2.5",
            rate_seconds=60.0,
            rate_warmup_seconds=1.0,
            seed=7,
            api_key="k",
            endpoint="/v1/completions",
        )
    )
    assert settings.levels == (2, 4, 8) and settings.max_tokens == 64 and settings.seed == 7
    assert (settings.request_timeout_s, settings.max_level_s) == (9.0, 3.0)
    assert settings.slo == Slo(ttft_p95_s=2.0, tpot_p95_s=0.1)
    assert settings.adapters == ("sql-lora", "chat-lora")
    assert (settings.rates, settings.rates_auto, settings.rate_level_s, settings.rate_warmup_s) == (
        (1.0, 2.5),
        False,
        60.0,
        1.0,
    )
    assert settings.api_key == "k" and settings.endpoint == "/v1/completions"
    # the ladder's timings without a ladder: the settings keep their own
    alone = settings_from_options(_defaults(rate_seconds=60.0))
    assert alone.rate_level_s == ProbeSettings.rate_level_s and alone.rates == ()


@pytest.mark.parametrize(
    ("given", "error", "names"),
    [
        ({"levels": "0,1"}, click.BadParameter, "--levels"),
        ({"levels": "a"}, click.BadParameter, "--levels"),
        ({"adapters": " , "}, click.BadParameter, "--adapters"),
        ({"rates": "x"}, click.BadParameter, "--rates"),
        ({"prompts": "/no/such/prompts.txt"}, click.UsageError, "prompts.txt"),
    ],
)
def test_a_bad_value_is_a_usage_error_naming_it(given, error, names):
    with pytest.raises(error) as raised:
        settings_from_options(_defaults(**given))
    shown = raised.value.format_message() + str(getattr(raised.value, "param_hint", ""))
    assert names in shown
