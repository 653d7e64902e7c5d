"""Everything loaded is checked: dense weights and the manifest against the checksums written at
repack (hashed again only when they change on disk), sluice.json against its schema."""
import json
import shutil

import pytest

from engine.errors import SluiceError
from engine.format import integrity
from engine.format.modeldir import open_model_dir

PROMPT = ["--prompt-ids", "1,2,3", "--max-new-tokens", "2"]


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


@pytest.fixture
def model(tiny_model, tmp_path):
    return shutil.copytree(tiny_model, tmp_path / "m")


def test_repack_writes_checksums_of_dense_and_manifest(model):
    sums = json.loads((model / "checksums.json").read_text())
    assert set(sums) == {"dense.safetensors", "sluice.json"}
    assert sums["dense.safetensors"] == integrity.sha256_file(model / "dense.safetensors")


@pytest.mark.parametrize("where", ["middle", "end"])
def test_one_changed_byte_in_dense_weights_is_refused(cli, model, where):
    size = (model / "dense.safetensors").stat().st_size
    flip_byte(model / "dense.safetensors", size // 2 if where == "middle" else size - 1)
    code, err = cli("generate", model, *PROMPT)
    assert code == 2 and "dense.safetensors" in err and "does not match the checksum" in err and "Traceback" not in err


def test_truncated_dense_weights_are_refused(cli, model):
    data = (model / "dense.safetensors").read_bytes()
    (model / "dense.safetensors").write_bytes(data[: len(data) // 2])
    code, err = cli("generate", model, *PROMPT)
    assert code == 2 and "does not match the checksum" in err


def test_edited_manifest_value_is_refused(cli, model):
    manifest = json.loads((model / "sluice.json").read_text())
    manifest["config"]["rms_norm_eps"] = 0.5                     # valid JSON, valid schema, wrong model
    (model / "sluice.json").write_text(json.dumps(manifest, indent=1))
    code, err = cli("generate", model, *PROMPT)
    assert code == 2 and "sluice.json" in err and "does not match the checksum" in err


def test_verified_files_are_hashed_again_only_after_they_change(model, monkeypatch):
    hashed = []
    real = integrity.sha256_file
    monkeypatch.setattr(integrity, "sha256_file", lambda p: (hashed.append(p.name), real(p))[1])
    open_model_dir(model)
    assert sorted(hashed) == ["dense.safetensors", "sluice.json"]         # first load: in full
    hashed.clear()
    open_model_dir(model)
    assert hashed == []                                                   # unchanged: the stamp is enough
    flip_byte(model / "dense.safetensors", 100)
    with pytest.raises(SluiceError, match="does not match"):
        open_model_dir(model)
    assert hashed == ["dense.safetensors"]


@pytest.mark.parametrize("edit, words", [
    (lambda m: m["experts"].__setitem__("num_experts", "eight"), "'experts.num_experts' is 'eight'"),
    (lambda m: m["experts"]["layers"]["0"]["crc32"].pop(), "checksums for 8 experts"),
    (lambda m: m["experts"]["layout"][1].__setitem__("offset", 3), "expert layout does not match"),
    (lambda m: m.pop("dense"), "'dense' is missing"),
    (lambda m: m.__setitem__("quant", "int3"), "unknown quant 'int3'"),
    (lambda m: m["experts"].__setitem__("total_bytes", 1), "'experts.total_bytes' is 1"),
    (lambda m: m["config"].__setitem__("num_experts_per_tok", 99), "is inconsistent"),
])
def test_manifest_that_breaks_the_schema_is_one_sentence(cli, model, edit, words):
    (model / "checksums.json").unlink()                  # as from a Sluice before checksums: the schema still holds
    manifest = json.loads((model / "sluice.json").read_text())
    del manifest["integrity"]                            # nor the manifest's own digest
    edit(manifest)
    (model / "sluice.json").write_text(json.dumps(manifest))
    code, err = cli("generate", model, *PROMPT)
    assert code == 2 and words in err and "Traceback" not in err, err


def test_corrupted_auto_repack_cache_is_rebuilt_and_named(cli, tiny_snapshot, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    snapshot = shutil.copytree(tiny_snapshot, tmp_path / "snap")
    code, err = cli("generate", snapshot, *PROMPT, "--json")
    assert code == 0
    [cached] = list((tmp_path / "cache").rglob("experts.bin"))
    good = cached.read_bytes()
    flip_byte(cached, len(good) // 3)
    code, err = cli("generate", snapshot, *PROMPT, "--json")
    assert code == 0 and f"The cached repack at '{cached.parent}' is damaged" in err and "rebuilding" in err
    assert cached.read_bytes() == good
    (cached.parent / "dense.safetensors").write_bytes(b"junk")
    code, err = cli("generate", snapshot, *PROMPT)
    assert code == 0 and "rebuilding" in err
