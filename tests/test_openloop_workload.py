"""Prompt-length classes in the workload file (collector.analysis.workload, `inputs:`): each
output class crossed with each input class, a fixed filler prompt per run, faults named."""

from __future__ import annotations

import pytest

from collector.analysis.cli import _class_settings
from collector.analysis.probe import ProbeSettings
from collector.analysis.workload import WorkloadClass, load_workload

CROSSED = """\
classes:
  - name: chat
    max_tokens: 64
  - name: essay
    max_tokens: 512
inputs:
  - name: short
    prompt_tokens: 100
  - name: long
    prompt_tokens: 1000
"""


def test_each_class_is_measured_once_per_input_class(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(CROSSED)
    assert load_workload(str(path)) == (
        WorkloadClass("chat-short", 64, prompt_tokens=100),
        WorkloadClass("essay-short", 512, prompt_tokens=100),
        WorkloadClass("chat-long", 64, prompt_tokens=1000),
        WorkloadClass("essay-long", 512, prompt_tokens=1000),
    )
    runs = _class_settings(ProbeSettings(url="http://127.0.0.1:1"), str(path))
    by_class = {run.task_class: run for run in runs}
    # a fixed-length filler prompt (the from-log mechanism, one length pair) per run
    assert by_class["chat-long"].lengths == ((1000, 64),)
    assert by_class["essay-short"].lengths == ((100, 512),)
    assert len({run.run_id for run in runs}) == 4


def test_without_inputs_a_class_keeps_its_prompt_set(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text("classes:\n  - name: chat\n    max_tokens: 64\n    prompts: long\n")
    (run,) = _class_settings(ProbeSettings(url="http://127.0.0.1:1"), str(path))
    assert run.lengths == () and run.prompts == "long" and run.task_class == "chat"


@pytest.mark.parametrize(
    ("inputs", "fault"),
    [
        ("inputs: []\n", "inputs must be a list"),
        ("inputs:\n  - name: short\n", "exactly name and prompt_tokens"),
        ("inputs:\n  - name: Short\n    prompt_tokens: 10\n", "inputs[0].name 'Short'"),
        ("inputs:\n  - name: s\n    prompt_tokens: 0\n", "prompt_tokens 0 must be a positive integer"),
        ("inputs:\n  - name: " + "x" * 30 + "\n    prompt_tokens: 10\n", "longer than 32 characters"),
    ],
)
def test_bad_input_classes_are_named(tmp_path, inputs, fault):
    path = tmp_path / "w.yaml"
    path.write_text("classes:\n  - name: chat\n    max_tokens: 64\n" + inputs)
    with pytest.raises(ValueError, match=fault.replace("[", r"\[").replace("]", r"\]")):
        load_workload(str(path))


def test_a_class_with_its_own_prompts_cannot_be_crossed(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(
        "classes:\n  - name: chat\n    max_tokens: 64\n    prompts: long\n"
        "inputs:\n  - name: s\n    prompt_tokens: 10\n"
    )
    with pytest.raises(ValueError, match="drop the classes' prompts"):
        load_workload(str(path))


def test_a_length_classs_filler_is_new_to_the_engine_on_every_run():
    """An engine that caches prefixes (vLLM's prefix cache, llama-server's slot cache) must not
    prefill a second probe run's prompts from the first's: the filler for a length class differs
    between runs and between the requests of a run, at the length asked for."""
    from collector.analysis.probe import ProbeSettings, _Runner

    settings = ProbeSettings(url="http://127.0.0.1:9", lengths=((100, 8),))

    def run(run_id: str) -> list[str]:
        runner = _Runner(settings, None, "m", run_id, None, None)  # type: ignore[arg-type]
        texts = []
        for i in range(50):
            runner.sequence += 1  # as each request's spec does
            texts.append(runner._shape(f"{run_id}-{i}")[0])
        return texts

    first, second = run("probe-a"), run("probe-b")
    assert len(set(first)) == 50 and not set(first) & set(second)
    assert {len(text) for text in first + second} == {400}  # 100 tokens at 4 characters each
