"""lamina.pictures: attention grids and loss curves come back as PNG / SVG bytes."""

import io

import pytest
import torch

from lamina.errors import LaminaError
from lamina.pictures import attention_grid, loss_curves, shown

PNG = b"\x89PNG\r\n\x1a\n"


def _size(png: bytes) -> tuple[int, int]:
    from matplotlib.image import imread

    h, w = imread(io.BytesIO(png), format="png").shape[:2]
    return w, h


def test_grid_is_a_png_whose_size_follows_layers_and_heads():
    maps = torch.softmax(torch.randn(2, 3, 5, 5), -1)
    labels, caps = list("ab c\n"), [[f"c{i}{h}" for h in range(3)] for i in range(2)]
    full = attention_grid(maps, labels, caps)
    one = attention_grid(maps, labels, caps, layers=[1], heads=[2])
    assert full.startswith(PNG) and one.startswith(PNG)
    (w_full, h_full), (w_one, h_one) = _size(full), _size(one)
    assert w_full > 2 * w_one and h_full > 1.5 * h_one


def test_svg_names_the_captions():
    maps = torch.softmax(torch.randn(1, 2, 3, 3), -1)
    svg = attention_grid(maps, list("abc"), [["previous token (0.91)", "x"]], fmt="svg")
    assert svg.lstrip().startswith(b"<?xml") and b"<svg" in svg


def test_bad_grid_input_is_an_error():
    maps = torch.zeros(1, 2, 3, 3)
    with pytest.raises(LaminaError, match="head index 2"):
        attention_grid(maps, list("abc"), [["a", "b"]], heads=[2])
    with pytest.raises(LaminaError, match="2 labels for 3"):
        attention_grid(maps, list("ab"), [["a", "b"]])
    with pytest.raises(LaminaError, match="format"):
        attention_grid(maps, list("abc"), [["a", "b"]], fmt="jpg")


def test_labels_make_whitespace_visible():
    assert shown(" ") == "\u2423" and shown("\n") == "\u21b5" and shown("\x01") == "\\x01"
    assert shown("a") == "a"


def test_curves_of_two_runs_with_and_without_time():
    a = [{"step": s, "loss": 3 - s / 10, "elapsed": s * 0.5} for s in range(1, 11)]
    a.append({"step": 10, "val_loss": 2.2, "elapsed": 5.0})
    b = [{"step": s, "loss": 3 - s / 20} for s in range(1, 11)]
    png = loss_curves([("a", a), ("b", b)])
    assert png.startswith(PNG) and _size(png)[0] > _size(png)[1]
    with pytest.raises(LaminaError, match="no runs"):
        loss_curves([])
