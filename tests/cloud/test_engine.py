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


def test_the_conversion_cache_is_keyed_by_content_and_abandoned_staging_is_removed(tmp_path, monkeypatch, tiny_models):
    """A GGUF replaced in place (same path, size and mtime) is converted anew; a copy elsewhere reuses
    the conversion; a staging folder whose process is gone is removed."""
    import os
    import shutil

    from cloud.models import content_key, resolve_target

    monkeypatch.setenv("SPLITSPEC_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "a" / "tiny.gguf"
    gguf.parent.mkdir()
    shutil.copy(tiny_models["drafter_f32"], gguf)
    key = content_key(gguf)
    abandoned = tmp_path / "cache" / "targets" / f"tiny-{key}.partial-999999999"
    abandoned.mkdir(parents=True)
    folder = resolve_target(gguf)
    assert folder.name == f"tiny-{key}" and (folder / "config.json").exists() and not abandoned.exists()
    copy = tmp_path / "b" / "tiny.gguf"
    copy.parent.mkdir()
    shutil.copy(gguf, copy)
    assert resolve_target(copy) == folder  # the same content: the same conversion
    stat = gguf.stat()
    data = bytearray(gguf.read_bytes())
    data[-1] ^= 0xFF  # replaced in place: one byte differs, same size and mtime
    gguf.write_bytes(bytes(data))
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert content_key(gguf) != key  # (the old key, path + size + mtime, would have served the stale folder)
