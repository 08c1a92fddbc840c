"""Formulas from DOMAIN: KV-cache ceiling (worked example 57 GB / 3 GB -> 19, configure 13),
quota ceilings from RPM/TPM, SLO maximum and the recommended pool per profile."""

from __future__ import annotations

import pytest
from test_analysis_knee import level

from collector.analysis.kv import GB, kv_bytes_per_token, kv_ceiling, usable_memory_bytes
from collector.analysis.quota import quota_ceiling
from collector.analysis.recommend import recommended_pool
from collector.analysis.slo import slo_max
from collector.capacity import Slo


def test_domain_worked_example_57_gb_over_3_gb_is_19_configure_13():
    result = kv_ceiling(usable_bytes=57 * GB, kv_bytes_per_request=3 * GB)
    assert (result.ceiling, result.configure) == (19, 13)


def test_usable_memory_of_the_96_gb_card_is_about_57_gb():
    usable = usable_memory_bytes(gpu_memory_bytes=96 * GB, weights_bytes=20 * GB, usable_fraction=0.8)
    assert usable / GB == pytest.approx(56.8)
    assert kv_ceiling(usable_bytes=usable, kv_bytes_per_request=3 * GB).ceiling == 18  # floor(18.9)


@pytest.mark.parametrize(
    "shape, per_token",
    [
        ((32, 8, 128, 2), 131072),  # Llama-3-8B, fp16: 128 KiB per token
        ((80, 8, 128, 2), 327680),  # Llama-3-70B, fp16: 320 KiB per token
        ((80, 8, 128, 1), 163840),  # the same with an fp8 KV cache
    ],
)
def test_kv_bytes_per_token_from_model_shape(shape, per_token):
    layers, kv_heads, head_dim, element = shape
    assert (
        kv_bytes_per_token(layers=layers, kv_heads=kv_heads, head_dim=head_dim, bytes_per_element=element)
        == per_token
    )


def test_kv_ceiling_of_a_70b_at_8k_context():
    per_request = kv_bytes_per_token(layers=80, kv_heads=8, head_dim=128) * 8192  # 2.68 GB
    result = kv_ceiling(usable_bytes=56.8 * GB, kv_bytes_per_request=per_request)
    assert (result.ceiling, result.configure) == (21, 14)


def test_kv_errors_name_the_bad_input():
    with pytest.raises(ValueError, match="nothing left for the KV cache"):
        usable_memory_bytes(gpu_memory_bytes=24 * GB, weights_bytes=30 * GB)
    with pytest.raises(ValueError, match="kv_bytes_per_request must be positive"):
        kv_ceiling(usable_bytes=GB, kv_bytes_per_request=0)


@pytest.mark.parametrize(
    "kwargs, by_rpm, by_tpm, ceiling, binding",
    [
        (dict(rpm=600, mean_e2e_s=10), 100.0, None, 100, "rpm"),
        (dict(rpm=600, tpm=1_000_000, mean_e2e_s=10, mean_tokens_per_request=4000), 100.0, 41.667, 41, "tpm"),
        (dict(rpm=60, tpm=10_000_000, mean_e2e_s=30, mean_tokens_per_request=500), 30.0, 10000.0, 30, "rpm"),
    ],
)
def test_quota_ceilings(kwargs, by_rpm, by_tpm, ceiling, binding):
    result = quota_ceiling(**kwargs)
    assert result.by_rpm == pytest.approx(by_rpm)
    assert (result.by_tpm is None) == (by_tpm is None)
    if by_tpm is not None:
        assert result.by_tpm == pytest.approx(by_tpm, rel=1e-3)
    assert (result.ceiling, result.binding) == (ceiling, binding)


def test_tpm_needs_tokens_per_request():
    with pytest.raises(ValueError, match="mean_tokens_per_request"):
        quota_ceiling(tpm=1000, mean_e2e_s=1)


LADDER_TTFT = [0.2, 0.3, 0.45, 0.9, 3.0]  # at 1, 2, 4, 8, 16


@pytest.mark.parametrize(
    "slo, expected",
    [
        (Slo(), None),
        (Slo(ttft_p95_s=0.5), 4),
        (Slo(ttft_p95_s=5.0), 16),
        (Slo(ttft_p95_s=0.1), 0),
        (Slo(ttft_p95_s=5.0, tpot_p95_s=0.01), 0),
    ],
)
def test_slo_max(slo, expected):
    levels = [level(2**i, 100 * 2**i, t) for i, t in enumerate(LADDER_TTFT)]
    assert slo_max(levels, slo) == expected


def test_slo_max_stops_at_the_first_failing_level():
    ttfts = [0.2, 0.3, 0.9, 0.4]  # 8 passes again after 4 failed: noise, not capacity
    levels = [level(2**i, 100, t) for i, t in enumerate(ttfts)]
    assert slo_max(levels, Slo(ttft_p95_s=0.5)) == 2


def test_slo_counts_errors():
    levels = [level(1, 100, 0.1), level(2, 200, 0.1, error_ratio=0.2)]
    assert slo_max(levels, Slo(ttft_p95_s=1.0)) == 1


@pytest.mark.parametrize(
    "knee, slo_max_value, profile, pool",
    [
        (16, 12, "interactive", 11),  # min(12, floor(11.2))
        (16, 8, "interactive", 8),  # the SLO binds
        (16, None, "interactive", 11),
        (16, None, "semi", 12),  # floor(12.8)
        (16, 4, "semi", 12),  # semi ignores the SLO maximum
        (16, 4, "batch", 16),
        (10, None, "interactive", 7),
        (1, None, "interactive", 1),  # never below 1 ...
        (8, 0, "interactive", 0),  # ... unless no level met the SLO
    ],
)
def test_recommended_pool_by_profile(knee, slo_max_value, profile, pool):
    assert recommended_pool(knee, slo_max_value, profile) == pool


def test_recommended_pool_rejects_unknown_profile_and_bad_knee():
    with pytest.raises(ValueError, match="interactive, semi, batch"):
        recommended_pool(8, None, "realtime")
    with pytest.raises(ValueError, match="measure the knee"):
        recommended_pool(0, None, "batch")
