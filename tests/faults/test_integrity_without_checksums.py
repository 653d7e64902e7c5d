"""A model dir that lost checksums.json is still checked: sluice.json against its own digest, the dense weights
against the sum the manifest repeats."""
import json
import shutil

import pytest

from test_integrity import PROMPT, flip_byte


@pytest.fixture
def model(tiny_model, tmp_path):
    path = shutil.copytree(tiny_model, tmp_path / "m")
    (path / "checksums.json").unlink()
    return path


def test_without_checksums_an_intact_model_loads(cli, model):
    assert cli("generate", model, *PROMPT)[0] == 0


def test_without_checksums_a_corrupted_dense_file_is_refused(cli, model):
    dense = model / "dense.safetensors"
    flip_byte(dense, dense.stat().st_size // 2)
    code, err = cli("generate", model, *PROMPT)
    assert code == 2 and "dense.safetensors' does not match the checksum" in err, err


def test_without_checksums_an_edited_manifest_is_refused(cli, model):
    manifest = json.loads((model / "sluice.json").read_text())
    manifest["config"]["rms_norm_eps"] = 0.5
    (model / "sluice.json").write_text(json.dumps(manifest, indent=1))
    code, err = cli("generate", model, *PROMPT)
    assert code == 2 and "sluice.json' was changed since the model was repacked" in err, err
