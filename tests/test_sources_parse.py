"""Pure parse functions of every engine source, on captured (llama.cpp) and built fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.sources.base import ExpositionError, FieldRule, parse_exposition
from collector.sources.detect import detect_engine
from collector.sources.generic import MappingError, load_mapping, mapping_from_dict, parse_generic
from collector.sources.llamacpp import kv_from_slots, parse_llamacpp, slots_url
from collector.sources.sglang import parse_sglang
from collector.sources.tgi import parse_tgi
from collector.sources.vllm import parse_vllm

FIXTURES = Path(__file__).parent / "fixtures"


def read(relative: str) -> str:
    return (FIXTURES / relative).read_text()


def slots(name: str) -> list:
    return json.loads(read(f"llamacpp/{name}"))


def test_llamacpp_busy_capture_gives_running_4_waiting_2_and_kv_from_slots():
    snap = parse_llamacpp(read("llamacpp/metrics_busy.txt"), slots("slots_busy.json"))
    assert (snap.engine, snap.up, snap.running, snap.waiting) == ("llamacpp", True, 4, 2)
    # 4 slots x n_ctx 2048; three busy slots hold 71 + 36 tokens, one holds 73 + 38
    assert snap.kv_capacity_tokens == 8192
    assert snap.kv_usage_ratio == pytest.approx((3 * (71 + 36) + 73 + 38) / 8192)
    assert snap.model is None  # llama.cpp labels carry no model
    assert snap.max_concurrency == 4  # the engine's own ceiling: one request per slot


def test_llamacpp_idle_capture_is_empty_and_idle_slots_count_as_free():
    snap = parse_llamacpp(read("llamacpp/metrics_idle_after_load.txt"), slots("slots_idle.json"))
    assert (snap.running, snap.waiting) == (0, 0)
    assert snap.kv_usage_ratio == 0.0 and snap.kv_capacity_tokens == 8192


def test_llamacpp_without_slots_leaves_kv_unknown_not_zero():
    snap = parse_llamacpp(read("llamacpp/metrics_busy.txt"), None)
    assert (snap.running, snap.waiting) == (4, 2)
    assert snap.kv_usage_ratio is None and snap.kv_capacity_tokens is None
    assert snap.max_concurrency is None


@pytest.mark.parametrize("junk", [None, {}, [], {"error": "slots disabled"}, [{"id": 0}], "x"])
def test_llamacpp_slots_junk_gives_no_estimate(junk):
    assert kv_from_slots(junk) == (None, None)


def test_llamacpp_older_slots_format_with_state_and_n_past():
    old = [
        {"id": 0, "n_ctx": 1000, "state": 1, "n_past": 250},
        {"id": 1, "n_ctx": 1000, "state": 0, "n_past": 900},
    ]
    assert kv_from_slots(old) == (pytest.approx(0.125), 2000)


def test_llamacpp_own_kv_metric_wins_over_the_slots_estimate():
    text = read("llamacpp/metrics_busy.txt") + "llamacpp:kv_cache_usage_ratio 0.5\n"
    assert parse_llamacpp(text, slots("slots_busy.json")).kv_usage_ratio == 0.5


@pytest.mark.parametrize(
    "url, expected",
    [
        ("http://h:8080/metrics", "http://h:8080/slots"),
        ("http://h:8080/metrics/", "http://h:8080/slots"),
        ("http://h:8080", "http://h:8080/slots"),
    ],
)
def test_slots_url_sits_beside_metrics(url, expected):
    assert slots_url(url) == expected


def test_vllm_new_kv_name_and_capacity_from_cache_config_info():
    snap = parse_vllm(read("vllm/metrics_v0_11.txt"))
    assert (snap.running, snap.waiting) == (7, 3)
    assert snap.kv_usage_ratio == pytest.approx(0.6375)
    assert snap.kv_capacity_tokens == 27403 * 16
    assert snap.model == "meta-llama/Llama-3.1-8B-Instruct"


def test_vllm_preemptions_and_prefix_cache_counters_summed_over_engines():
    new = parse_vllm(read("vllm/metrics_v0_11.txt"))
    assert (new.preemptions_total, new.prefix_cache_queries_total, new.prefix_cache_hits_total) == (
        2.0,
        182345.0,
        40112.0,
    )
    old = parse_vllm(read("vllm/metrics_v0_6.txt"))  # before 0.7: preemptions, no prefix-cache counters
    assert (old.preemptions_total, old.prefix_cache_queries_total, old.prefix_cache_hits_total) == (
        17.0,
        None,
        None,
    )
    dp = "".join(
        f'vllm:num_requests_running{{engine="{e}",model_name="m"}} 1\n'
        f'vllm:num_preemptions_total{{engine="{e}",model_name="m"}} {n}\n'
        for e, n in (("0", 3), ("1", 4))
    )
    assert parse_vllm(dp).preemptions_total == 7.0


def test_vllm_kv_max_concurrency_is_the_engines_ceiling_when_published():
    assert parse_vllm(read("vllm/metrics_v0_11.txt")).max_concurrency is None  # older page
    text = read("vllm/metrics_v0_11.txt") + (
        'vllm:cache_config_info{block_size="16",kv_cache_max_concurrency="46.3",'
        'kv_cache_size_tokens="438448",num_gpu_blocks="27403"} 1.0\n'
    )
    assert parse_vllm(text).max_concurrency == 46


def test_headroom_sidecar_page_relays_its_engine_figures():
    from collector.sources.headroom import parse_headroom

    text = (
        'headroom_engine_requests_running{engine="vllm",model="m"} 3\n'
        'headroom_engine_requests_waiting{engine="vllm",model="m"} 2\n'
        'headroom_inflight_requests{model="m",tenant="t"} 5\n'
    )
    snap = parse_headroom(text)
    assert (snap.running, snap.waiting, snap.model) == (3, 2, "m")
    assert detect_engine(parse_exposition(text)) == "headroom"


def test_vllm_old_kv_name_is_read_as_0_to_1_despite_perc():
    snap = parse_vllm(read("vllm/metrics_v0_6.txt"))
    assert (snap.running, snap.waiting) == (12, 0)
    assert snap.kv_usage_ratio == pytest.approx(0.91)
    assert snap.kv_capacity_tokens == 7281 * 16
    assert snap.model == "Qwen/Qwen2.5-7B-Instruct"


def test_vllm_new_name_wins_when_a_transition_release_exports_both():
    text = read("vllm/metrics_v0_11.txt") + ('vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.99\n')
    assert parse_vllm(text).kv_usage_ratio == pytest.approx(0.6375)


def test_vllm_data_parallel_sums_counts_and_takes_the_fullest_kv():
    rows = []
    for engine, running, waiting, kv in (("0", 5, 1, 0.4), ("1", 6, 2, 0.7)):
        labels = f'engine="{engine}",model_name="m"'
        rows += [
            f"vllm:num_requests_running{{{labels}}} {running}",
            f"vllm:num_requests_waiting{{{labels}}} {waiting}",
            f"vllm:kv_cache_usage_perc{{{labels}}} {kv}",
            f'vllm:cache_config_info{{block_size="16",engine="{engine}",num_gpu_blocks="100"}} 1.0',
        ]
    snap = parse_vllm("\n".join(rows) + "\n")
    assert (snap.running, snap.waiting, snap.kv_usage_ratio) == (11, 3, 0.7)
    assert snap.kv_capacity_tokens == 2 * 100 * 16


def test_vllm_capacity_unknown_before_profiling():
    text = (
        'vllm:num_requests_running{model_name="m"} 1\n'
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n'
    )
    assert parse_vllm(text).kv_capacity_tokens is None


def test_sglang_fixture():
    snap = parse_sglang(read("sglang/metrics_v0_5.txt"))
    assert (snap.running, snap.waiting) == (9, 4)
    assert snap.kv_usage_ratio == pytest.approx(0.28)
    assert snap.kv_capacity_tokens == 471258
    assert snap.model == "meta-llama/Llama-3.1-8B-Instruct"


def test_tgi_fixture_has_capacity_but_no_kv_usage():
    snap = parse_tgi(read("tgi/metrics_v3.txt"))
    assert (snap.running, snap.waiting) == (5, 2)
    assert snap.kv_usage_ratio is None
    assert snap.kv_capacity_tokens == 262144


def test_generic_mapping_with_list_scale_sum_and_label_selector():
    mapping = load_mapping(FIXTURES / "generic/mapping.yaml")
    snap = parse_generic(read("generic/metrics.txt"), mapping)
    assert (snap.engine, snap.model) == ("acme", "acme-13b")
    assert (snap.running, snap.waiting) == (6, 5)  # high 3 + low 2
    assert snap.kv_usage_ratio == pytest.approx(0.375)
    assert snap.kv_capacity_tokens == 65536  # only kind="capacity", not the "used" series


@pytest.mark.parametrize(
    "data, complaint",
    [
        ("just text", "expected a YAML mapping"),
        ({"running": "x"}, "'engine' must name"),
        ({"engine": "e"}, "map at least one"),
        ({"engine": "e", "runing": "x"}, "unknown keys ['runing']"),
        ({"engine": "e", "running": {"metric": "x", "scael": 2}}, "unknown keys ['scael']"),
        ({"engine": "e", "running": {"metric": "x", "aggregate": "median"}}, "aggregate 'median'"),
        ({"engine": "e", "running": {"metric": "x", "labels": ["a"]}}, "running.labels"),
        ({"engine": "e", "waiting": []}, "give a metric name"),
    ],
)
def test_generic_mapping_errors_name_the_bad_key(data, complaint):
    with pytest.raises(MappingError, match=complaint.replace("[", r"\[").replace("]", r"\]")):
        mapping_from_dict(data)


def test_generic_mapping_file_errors(tmp_path):
    with pytest.raises(MappingError, match="cannot read engine mapping"):
        load_mapping(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine: [unclosed\n")
    with pytest.raises(MappingError, match="not valid YAML"):
        load_mapping(bad)


@pytest.mark.parametrize("parse", [parse_vllm, parse_sglang, parse_tgi, parse_llamacpp])
def test_garbage_is_an_exposition_error(parse):
    with pytest.raises(ExpositionError):
        parse("<html><body>502 Bad Gateway</body></html>\n")


def test_a_malformed_line_of_a_wanted_metric_is_an_exposition_error():
    with pytest.raises(ExpositionError, match="not Prometheus text format"):
        parse_vllm('vllm:num_requests_running{model_name="m" 3\n')


def test_only_the_wanted_samples_are_parsed():
    text = read("vllm/metrics_v0_11.txt")
    kept = parse_exposition(text, frozenset({"vllm:num_requests_running"}))
    assert list(kept) == ["vllm:num_requests_running"]
    assert parse_exposition(text)["vllm:num_requests_running"] == kept["vllm:num_requests_running"]


def test_another_engines_page_is_an_error_not_an_empty_snapshot():
    with pytest.raises(ExpositionError, match="check --engine"):
        parse_vllm(read("sglang/metrics_v0_5.txt"))


def test_nan_samples_are_ignored():
    rule = FieldRule(("x",))
    assert rule.apply(parse_exposition("x NaN\n")) is None


@pytest.mark.parametrize(
    "fixture, engine",
    [
        ("vllm/metrics_v0_11.txt", "vllm"),
        ("vllm/metrics_v0_6.txt", "vllm"),
        ("sglang/metrics_v0_5.txt", "sglang"),
        ("tgi/metrics_v3.txt", "tgi"),
        ("llamacpp/metrics_busy.txt", "llamacpp"),
        ("llamacpp/metrics_idle_after_load.txt", "llamacpp"),
        ("generic/metrics.txt", None),  # unknown engines are not guessed: they need a mapping
    ],
)
def test_auto_detection_on_every_fixture(fixture, engine):
    assert detect_engine(parse_exposition(read(fixture))) == engine


@pytest.mark.parametrize(
    "fixture",
    sorted(
        str(path.relative_to(FIXTURES))
        for folder in ("vllm", "sglang", "tgi", "generic")
        for path in (FIXTURES / folder).glob("*.txt")
    ),
)
def test_every_built_fixture_says_what_it_imitates(fixture):
    header = read(fixture).splitlines()[0]
    assert header.startswith("# Imitates") or "imitates no public engine" in read(fixture)
