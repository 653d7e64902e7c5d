"""Qt-free wizard helpers: where downloads and models go, and the numbers the pages show."""
from __future__ import annotations

from app.setup.common import format_duration, model_dir_name, snapshot_dir
from engine.plan.estimate import format_params


def test_snapshots_are_hidden_beside_the_models(tmp_path):
    assert snapshot_dir(tmp_path, "Qwen/Qwen3-30B-A3B") == tmp_path / ".downloads" / "Qwen--Qwen3-30B-A3B"


def test_model_dir_name_drops_the_owner_and_adds_the_quant():
    assert model_dir_name("Qwen--Qwen3-30B-A3B", "fp8") == "Qwen3-30B-A3B-fp8"
    assert model_dir_name("my model (copy)", "nvfp4") == "my-model-copy-nvfp4"


def test_human_numbers():
    assert format_params(30_532_122_624) == "30.5B" and format_params(3_353_032_704) == "3.4B"
    assert format_duration(None) == "estimating time left"
    assert format_duration(42.4) == "42 s left"
    assert format_duration(125) == "2 min 05 s left"
    assert format_duration(3 * 3600 + 7 * 60) == "3 h 07 min left"
