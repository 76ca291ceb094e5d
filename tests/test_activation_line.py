"""The training console's MLP line (issue 38, item 10): a ReLU's zero outputs are said as zeros
('sparse, not saturated'), never as '51% of activations saturated'; tanh/GELU keep 'saturated'."""

from __future__ import annotations

from train.records import activation_line


def test_a_relu_layer_is_told_as_zeros_not_saturation():
    layers = [{"dead": 0.0, "saturated": 0.51}, {"dead": 0.02, "saturated": 0.48}]
    line = activation_line(layers, "relu")
    assert line == "MLP units: up to 2% dead; 51% of ReLU outputs are zero (sparse, not saturated)"
    assert "activations saturated" not in line


def test_tanh_and_gelu_say_saturated():
    layers = [{"dead": 0.1, "saturated": 0.3}]
    assert activation_line(layers, "tanh") == "MLP units: up to 10% dead, 30% of activations saturated"
    assert activation_line(layers, "gelu").endswith("30% of activations saturated")
    assert activation_line([{"dead": 0.0, "saturated": None}], "gelu").endswith("0% of activations saturated")
