"""Trust no kernel: a broken variant is caught, the reference runs instead, the user is warned,
and the verdict is cached per device + kernel version + shape."""
import json

import pytest
import torch

from kernels import selfcheck
from kernels.formats import make_offsets
from kernels.moe_decode import DecodeConfig, moe_decode, moe_decode_ref

FMT, I, H, K = "fp8", 16, 32, 2    # small: the check runs the shipped (narrow) row blocks, on the CPU interpreted


def _select(device, kernel=None):
    offsets, block_bytes = make_offsets(FMT, I, H)
    return selfcheck.select_moe_decode(FMT, offsets, block_bytes, I, H, K, device, kernel=kernel, dtype=torch.float32)


def _wrong(*args, **kw):                  # off by a few percent: the classic silent miscompile
    return moe_decode(*args, **kw) * 1.05


def _nan(*args, **kw):
    out = moe_decode(*args, **kw)
    out[0, -1] = float("nan")
    return out


def _raises(*args, **kw):
    raise RuntimeError("out of resource: shared memory, Required: 232448, Hardware limit: 101376")


def test_good_kernel_is_chosen_and_cached(device):
    calls = []

    def counting(*args, **kw):
        calls.append(1)
        return moe_decode(*args, **kw)

    fn, verdict = _select(device, counting)
    assert fn is counting and verdict.ok and not verdict.cached
    num_calls = len(calls)
    fn2, verdict2 = _select(device, counting)
    assert fn2 is counting and verdict2.cached and len(calls) == num_calls      # second start: no re-check
    assert len(json.loads(selfcheck.cache_path().read_text())) == 1


@pytest.mark.parametrize("broken,reason", [(_wrong, "exceeds"), (_nan, "NaN"), (_raises, "shared memory")])
def test_broken_kernel_falls_back_to_reference_with_warning(device, capsys, broken, reason):
    earlier = len(selfcheck.warnings_seen())          # other tests' failed checks warned in this process too
    with pytest.warns(RuntimeWarning, match="reference path"):
        fn, verdict = _select(device, broken)
    assert fn is moe_decode_ref and not verdict.ok and reason in verdict.reason
    assert "is not used on this GPU" in capsys.readouterr().err
    assert any(reason in w for w in selfcheck.warnings_seen()[earlier:])
    calls = []

    def counting(*args, **kw):
        calls.append(1)
        return broken(*args, **kw)

    fn2, verdict2 = _select(device, counting)      # cached failure: not re-run, warned once per process
    assert fn2 is moe_decode_ref and verdict2.cached and not calls
    assert sum(reason in w for w in selfcheck.warnings_seen()[earlier:]) == 1


def test_new_kernel_version_is_checked_again(device, monkeypatch):
    _select(device)
    import kernels.moe_decode as md
    monkeypatch.setattr(md, "KERNEL_VERSION", md.KERNEL_VERSION + 1)
    _, verdict = _select(device)
    assert not verdict.cached
    assert len(json.loads(selfcheck.cache_path().read_text())) == 2


def test_unwritable_cache_still_checks(device, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SLUICE_DATA_DIR", str(blocker / "sub"))                   # a parent is a file
    fn, verdict = _select(device)
    assert verdict.ok and fn is moe_decode


def test_int8_kernel_is_checked_in_bf16_and_a_misread_scale_is_caught(device):
    """int8 blocks with bf16 activations, as the engine runs them: the kernel passes its check; one
    that misreads the bf16 row scales (every scale 1) does not."""
    offsets, block_bytes = make_offsets("int8", I, H)
    small = DecodeConfig(block_i=16, block_h=16, block_k=32)          # interpreter-sized tiles

    def select(kernel):
        return selfcheck.select_moe_decode("int8", offsets, block_bytes, I, H, K, device, kernel=kernel)

    def good(*args, **kw):
        return moe_decode(*args, config=small)

    def unit_scales(x, bank, *rest, **kw):
        bank = bank.clone()
        for proj, rows in (("gate", I), ("up", I), ("down", H)):
            start = offsets[f"{proj}.scale"]
            bank[:, start:start + 2 * rows] = torch.ones(rows, dtype=torch.bfloat16).view(torch.uint8).to(bank.device)
        return moe_decode(x, bank, *rest, config=small)

    fn, verdict = select(good)
    assert fn is good and verdict.ok
    selfcheck.cache_path().unlink()                 # verdicts are cached per shape, not per function
    with pytest.warns(RuntimeWarning, match="reference path"):
        fn, verdict = select(unit_scales)
    assert fn is moe_decode_ref and "exceeds" in verdict.reason


def test_the_verdicts_live_in_the_data_folder_or_the_users_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("SLUICE_DATA_DIR", str(tmp_path / "data"))
    assert selfcheck.cache_path() == tmp_path / "data" / "cache" / "kernel_verdicts.json"
    monkeypatch.delenv("SLUICE_DATA_DIR")
    assert selfcheck.cache_path().name == "kernel_verdicts.json" and "data" not in selfcheck.cache_path().parts[-3:]
