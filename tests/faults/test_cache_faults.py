"""The auto-repack cache follows every file of the snapshot it was built from, and heals an entry that
something replaced; a destination that cannot be written is one sentence, not an endless wait."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.format.resolve import cached_repack_dir

ROOT = Path(__file__).resolve().parents[2]
PROMPT = ("--chat", "--prompt", "hi", "--max-new-tokens", "3", "--json")


@pytest.fixture
def cached(cli, tiny_snapshot, tmp_path, monkeypatch):
    """A snapshot copy and its cache entry, built by a first `sluice generate`."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    snapshot = shutil.copytree(tiny_snapshot, tmp_path / "snap")
    assert cli("generate", snapshot, *PROMPT)[0] == 0
    return snapshot, cached_repack_dir(snapshot)


@pytest.mark.parametrize("name,edit", [
    ("chat_template.jinja", lambda text: "SYSTEM PROMPT CHANGED " + text),
    ("tokenizer_config.json", lambda text: json.dumps({**json.loads(text), "model_max_length": 77})),
    ("config.json", lambda text: json.dumps({**json.loads(text), "max_position_embeddings": 200})),
    ("generation_config.json", lambda text: json.dumps({**json.loads(text), "temperature": 0.3})),
])
def test_an_edit_to_the_snapshot_s_metadata_rebuilds_the_cache(cli, cached, name, edit):
    snapshot, entry = cached
    path = snapshot / name
    path.write_text(edit(path.read_text()))
    assert cli("generate", snapshot, *PROMPT)[0] == 0
    assert (entry / name).read_text() == path.read_text() if name != "config.json" else \
        json.loads((entry / "sluice.json").read_text())["config"]["max_position_embeddings"] == 200


def test_a_cache_entry_replaced_by_a_file_is_rebuilt(cli, cached):
    snapshot, entry = cached
    shutil.rmtree(entry)
    entry.write_text("not a model")
    code, err = cli("generate", snapshot, *PROMPT)
    assert code == 0 and "is not a folder; rebuilding it" in err and (entry / "sluice.json").is_file()


def test_repack_into_a_folder_that_cannot_be_written_says_so(tiny_snapshot):
    run = subprocess.run([sys.executable, "-m", "app.main", "repack", str(tiny_snapshot), "/proc/sluice-dst"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "/proc" in run.stderr and "Another Sluice process" not in run.stderr
    assert "Traceback" not in run.stderr and run.stderr.strip().splitlines()[-1].startswith("sluice: ")
