"""predict.png's title fits the image (issue 35, item 7): with one episode the figure is 6 inches
wide and the title (family, run folder, weights, sampling steps, chunk spacing, legend) ran off both
edges. The oracle: matplotlib's own rendered extent of the title, inside the figure's, and above
every axes' (no overlap with the plots).
"""
from __future__ import annotations

import numpy as np
import pytest

from trainkit.predict.chunks import Episode


@pytest.mark.parametrize("episodes", [1, 3])
def test_the_title_lies_inside_the_figure_and_above_the_axes(episodes):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trainkit.predict.report import figure

    rng = np.random.default_rng(0)
    eps = [Episode(e, rng.normal(size=(30, 7)), rng.normal(size=(30, 7))) for e in range(episodes)]
    title = ("pi05 a_rather_long_run_folder_name_from_a_sweep_2026-12-07_lr3e-4_mbs8 (ema weights): 10 sampling "
             "steps, a chunk every 50 frames; recorded (black) vs predicted (dashed)")
    fig = figure(eps, [f"joint_{i}" for i in range(7)], 10, title)
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        box, page = fig._suptitle.get_window_extent(renderer), fig.bbox
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and box.y1 <= page.y1, (box, page)
        tops = [ax.get_tightbbox(renderer).y1 for ax in fig.axes]
        assert max(tops) <= box.y0 + 1, (max(tops), box)
    finally:
        plt.close(fig)
