"""Masked mean pooling (C01) and the pad-token rules (C02)."""

import pytest
import torch

from obliq.model import mean_pool

PAD = [0.0, 5.0]  # pad states are not zero in real models (C01)


def test_c01_right_and_left_padding_give_the_masked_mean():
    a = [[1.0, 0.0], [0.0, 2.0], [2.0, 4.0]]
    b_right = [[3.0, 1.0], PAD, PAD]
    b_left = [PAD, PAD, [3.0, 1.0]]
    expect_a, expect_b = [0.447214, 0.894427], [0.948683, 0.316228]
    right = mean_pool(torch.tensor([a, b_right]), torch.tensor([[1, 1, 1], [1, 0, 0]]))
    left = mean_pool(torch.tensor([a, b_left]), torch.tensor([[1, 1, 1], [0, 0, 1]]))
    for out in (right, left):
        assert out[0].tolist() == pytest.approx(expect_a, abs=1e-6)
        assert out[1].tolist() == pytest.approx(expect_b, abs=1e-6)
    assert out.dtype == torch.float32


def test_pooling_rejects_a_row_without_real_tokens():
    with pytest.raises(ValueError, match="no real token"):
        mean_pool(torch.ones(1, 2, 2), torch.zeros(1, 2))
