"""Layer labels and the innermost-range lookup on hand-made inputs (nesting the real captures do not exercise)."""
from __future__ import annotations

import numpy as np
import pytest

from profattr.attribute.layers import compile_layer_pattern, deepest, layer_label
from profattr.errors import ProfattrError

DEFAULT = compile_layer_pattern(None)


@pytest.mark.parametrize("text, label", [
    ("model.layers.3", 3),
    ("model.model.layers.12.mlp.experts", 12),
    ("{'Module': 'model.model.layers.3.mlp.experts', 'Inputs': [[1, 2048]]}", 3),  # SGLang layerwise marker
    ("decoder.layer_7", 7),
    ("transformer_layers_30_attn", 30),
    ("layer.5", 5),
    ("decode_step", None),
    ("model.norm", None),
    ("num_players_3", None),  # "layers" inside a longer word is not a layer
    ("model.layers", None),
])
def test_default_pattern(text, label):
    assert layer_label(text, DEFAULT) == label


def test_custom_pattern_labels():
    assert layer_label("block 4 / mlp", compile_layer_pattern(r"block (\d+)")) == 4
    assert layer_label("stage-b", compile_layer_pattern(r"stage-(?P<layer>\w)")) == "b"
    assert layer_label("enc.blk", compile_layer_pattern(r"enc\.\w+")) == "enc.blk"
    with pytest.raises(ProfattrError, match="--layer-range"):
        compile_layer_pattern("layers.(")


def test_deepest_walks_up_past_ended_ranges():
    # thread 1: A [0, 100] > B [10, 60] > C [20, 30]; D [200, 300]. thread 2: E [0, 1000]
    tid = np.array([1, 1, 1, 1, 2])
    start = np.array([0, 10, 20, 200, 0])
    end = np.array([100, 60, 30, 300, 1000])
    q_tid = np.array([1, 1, 1, 1, 1, 1, 2, 3])
    q_t = np.array([25, 40, 80, 150, 300, -1, 150, 5])
    # C, B (C ended), A (B and C ended), none, D (inclusive end), none, E, unknown thread
    assert deepest(tid, start, end, q_tid, q_t).tolist() == [2, 1, 0, -1, 3, -1, 4, -1]


def test_deepest_equal_starts_prefers_inner():
    tid = np.array([1, 1])
    start = np.array([0, 0])
    end = np.array([100, 50])
    assert deepest(tid, start, end, np.array([1, 1]), np.array([10, 70])).tolist() == [1, 0]
