"""The target engine: cache cropping is exact, and the padded head changes nothing."""

from __future__ import annotations

import torch

from cloud.invariance.padding import RowPaddedHead


def test_row_padded_head_matches_the_plain_head():
    torch.manual_seed(0)
    head = torch.nn.Linear(32, 1000, bias=False)
    padded = RowPaddedHead(head)
    assert padded.weight is head.weight
    for rows in range(1, 7):
        hidden = torch.randn(1, rows, 32)
        out = padded(hidden)
        assert out.shape == (1, rows, 1000)
        torch.testing.assert_close(out, head(hidden), atol=1e-5, rtol=1e-5)


def test_crop_then_forward_equals_a_fresh_forward(tiny_engine):
    tokens = [1, 40, 41, 42, 43, 44, 45]
    fresh = tiny_engine.new_sequence()
    want = tiny_engine.forward(fresh, tokens)

    seq = tiny_engine.new_sequence()
    tiny_engine.forward(seq, tokens[:4])
    tiny_engine.forward(seq, [7, 8, 9])  # a rejected block
    tiny_engine.crop(seq, 4)
    got = tiny_engine.forward(seq, tokens[4:])
    assert seq.length == len(tokens)
    torch.testing.assert_close(got, want[4:], atol=1e-4, rtol=1e-4)
    assert (got.argmax(-1) == want[4:].argmax(-1)).all()
