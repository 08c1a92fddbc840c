"""The backtest's picture keeps the knee readable: an overload's queue does not set the y axis."""

from __future__ import annotations

from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from collector.backtest.plot import CLIP_AT_KNEES, _caliber, _y_top  # noqa: E402


def test_the_axis_clips_an_overload_far_past_the_knee_and_keeps_the_rest_whole():
    assert _y_top([10, 550], 32) == (CLIP_AT_KNEES * 32, True)  # the ramp: knee ~32, queue to 550
    assert _y_top([10, 40], 32) == (42.0, False)  # near the knee: the peak with room
    assert _y_top([1, 5], 32) == (32 * 1.1, False)  # below it: the knee line still shows
    assert _y_top([], None) == (1.0, False)


def test_a_clipped_caliber_panel_says_where_its_peak_was():
    result = SimpleNamespace(
        timeline=SimpleNamespace(start=0.0),
        calibers={"requests": [(60.0 * m, float(v)) for m, v in enumerate([4, 16, 32, 120, 550])]},
        knee={"requests": 32},
    )
    figure, axis = plt.subplots()
    try:
        _caliber(axis, result, "requests", "in-flight requests", replicas=1)
        assert axis.get_ylim() == (0.0, 96.0)
        assert [text.get_text() for text in axis.texts] == ["off scale: peaks at 550"]
    finally:
        plt.close(figure)
