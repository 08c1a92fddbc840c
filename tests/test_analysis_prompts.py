"""Prompt sets of the probe: built-ins, a file, a seeded order."""

from __future__ import annotations

import pytest

from collector.analysis.prompts import PromptPicker, load_prompts


def test_builtin_sets_differ_in_length():
    short, long, mixed = (load_prompts(name) for name in ("short", "long", "mixed"))
    assert max(map(len, short)) < 100 < 3000 < min(map(len, long))
    assert sum(len(p) > 3000 for p in mixed) / len(mixed) == pytest.approx(0.2)


def test_file_has_one_prompt_per_line(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("first prompt\n\n  second prompt  \n")
    assert load_prompts(str(path)) == ["first prompt", "second prompt"]
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="no non-empty lines"):
        load_prompts(str(tmp_path / "empty.txt"))
    with pytest.raises(ValueError, match="short, long, mixed"):
        load_prompts(str(tmp_path / "missing.txt"))


def test_picker_is_seeded_and_cycles():
    prompts = [f"p{i}" for i in range(5)]
    a, b = PromptPicker(prompts, seed=3), PromptPicker(prompts, seed=3)
    sequence = [a.next() for _ in range(10)]
    assert sequence == [b.next() for _ in range(10)]  # same seed, same order
    assert sorted(sequence[:5]) == prompts and sequence[5:] == sequence[:5]  # each once per cycle
    other = PromptPicker(prompts, seed=4)
    assert [other.next() for _ in range(5)] != sequence[:5]
