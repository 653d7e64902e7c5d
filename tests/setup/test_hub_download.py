"""Hub search/info and the resuming downloader against the local mock hub (real HTTP on 127.0.0.1)."""
from __future__ import annotations

import threading
import time

import pytest

from setup_support import MIXTRAL_REPO, SUPPORTED_REPO, UNSUPPORTED_REPO, same_files
from engine import SluiceError
from engine.hub.search import parse_repo_ref, repo_info, search
from engine.hub.download import STATE_DIR, DownloadStopped, download, missing_bytes

WEIGHTS = "model.safetensors"


def test_search_lists_supported_families_first_with_downloads_and_likes(hub):
    hits = search("tiny")
    assert [h.repo_id for h in hits] == [SUPPORTED_REPO, MIXTRAL_REPO, UNSUPPORTED_REPO]
    assert [h.is_supported for h in hits] == [True, True, False]
    assert (hits[0].family, hits[0].downloads, hits[0].likes) == ("qwen3_moe", 1200, 40)
    assert [h.repo_id for h in search("llama")] == [UNSUPPORTED_REPO]


def test_parse_repo_ref_accepts_names_urls_and_revisions():
    assert parse_repo_ref(" Qwen/Qwen3-30B-A3B ") == ("Qwen/Qwen3-30B-A3B", None)
    assert parse_repo_ref("Qwen/Qwen3-30B-A3B@v2") == ("Qwen/Qwen3-30B-A3B", "v2")
    assert parse_repo_ref("https://huggingface.co/Qwen/Qwen3-30B-A3B/tree/abc1") == ("Qwen/Qwen3-30B-A3B", "abc1")
    with pytest.raises(SluiceError, match="owner/name"):
        parse_repo_ref("just-a-name")


def test_repo_info_reads_config_and_hashed_file_list_without_weights(hub, model_folders):
    info = repo_info(SUPPORTED_REPO)
    assert info.revision == hub.repos[SUPPORTED_REPO].sha and info.family == "qwen3_moe" and info.is_supported
    weights = next(f for f in info.files if f.path == WEIGHTS)
    assert weights.size == (model_folders[SUPPORTED_REPO] / WEIGHTS).stat().st_size and weights.sha256
    assert hub.weight_requests() == []
    with pytest.raises(SluiceError, match="no model 'nobody/nothing'"):
        repo_info("nobody/nothing")
    with pytest.raises(SluiceError, match="no revision 'v9'"):
        repo_info(SUPPORTED_REPO, revision="v9")


def test_download_verifies_every_file_and_a_rerun_transfers_nothing(hub, model_folders, tmp_path):
    info = repo_info(SUPPORTED_REPO)
    seen = []
    download(info, tmp_path / "snap", progress=seen.append)
    names = [f.path for f in info.model_files()]
    assert WEIGHTS in names and "tokenizer.json" in names
    assert same_files(model_folders[SUPPORTED_REPO], tmp_path / "snap", names)
    last = seen[-1]
    assert last.bytes_done == last.bytes_total == sum(f.size for f in info.model_files())
    assert all(a.bytes_done <= b.bytes_done for a, b in zip(seen, seen[1:]))
    hub.reset_counters()
    download(info, tmp_path / "snap")
    assert hub.body_bytes_sent == 0 and missing_bytes(info, tmp_path / "snap") == 0


def test_connection_dropped_mid_file_resumes_with_a_range_request(hub, model_folders, tmp_path):
    info = repo_info(SUPPORTED_REPO)
    size = next(f.size for f in info.files if f.path == WEIGHTS)
    hub.drop_after[WEIGHTS] = size // 3
    download(info, tmp_path / "snap")
    ranges = [r for m, p, r in hub.requests if p.endswith(WEIGHTS)]
    assert ranges == [None, f"bytes={size // 3}-"]
    assert hub.bytes_sent_by_path[WEIGHTS] == size          # no byte fetched twice
    assert same_files(model_folders[SUPPORTED_REPO], tmp_path / "snap", [WEIGHTS])


def _stop_hub_when_part_reaches(hub, part, nbytes):
    def watch():
        while not (part.exists() and part.stat().st_size >= nbytes):
            time.sleep(0.005)
        hub.stop()
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_hub_lost_mid_file_gives_a_clear_error_and_retry_fetches_only_the_rest(hub, model_folders, tmp_path):
    info = repo_info(SUPPORTED_REPO)
    size = next(f.size for f in info.files if f.path == WEIGHTS)
    hub.throttle_bps = 2_000_000
    watcher = _stop_hub_when_part_reaches(hub, tmp_path / "snap" / STATE_DIR / (WEIGHTS + ".part"), size // 2)
    with pytest.raises(SluiceError, match="connection to the model hub was lost while downloading model.safetensors"):
        download(info, tmp_path / "snap")
    watcher.join()
    kept = (tmp_path / "snap" / STATE_DIR / (WEIGHTS + ".part")).stat().st_size
    assert size // 2 <= kept < size

    hub.throttle_bps = None
    hub.reset_counters()
    hub.start()                                           # the network is back: Retry
    download(info, tmp_path / "snap")
    total = sum(f.size for f in info.model_files())
    assert hub.bytes_sent_by_path[WEIGHTS] == size - kept
    assert hub.body_bytes_sent < total
    assert same_files(model_folders[SUPPORTED_REPO], tmp_path / "snap", [f.path for f in info.model_files()])


def test_wrong_content_is_detected_and_fetched_again(hub, model_folders, tmp_path):
    info = repo_info(SUPPORTED_REPO)
    hub.corrupt[WEIGHTS] = 1
    hub.corrupt["tokenizer.json"] = 1                     # a non-LFS file: checked by its git blob sha1
    download(info, tmp_path / "snap")
    assert [p for m, p, r in hub.requests if p.endswith(WEIGHTS)] != [] and \
        len([p for m, p, r in hub.requests if p.endswith(WEIGHTS)]) == 2
    assert len([p for m, p, r in hub.requests if p.endswith("tokenizer.json")]) == 2
    assert same_files(model_folders[SUPPORTED_REPO], tmp_path / "snap", [WEIGHTS, "tokenizer.json"])


def test_content_that_stays_wrong_is_refused(hub, tmp_path):
    info = repo_info(SUPPORTED_REPO)
    hub.corrupt[WEIGHTS] = 99
    with pytest.raises(SluiceError, match="model.safetensors .* failed its checksum"):
        download(info, tmp_path / "snap")
    assert not (tmp_path / "snap" / WEIGHTS).exists()


def test_unsupported_repo_is_refused_before_any_weight_is_downloaded(hub, tmp_path):
    info = repo_info(UNSUPPORTED_REPO)
    assert info.family == "llama" and not info.is_supported
    with pytest.raises(SluiceError, match="'llama' model, which Sluice cannot run"):
        download(info, tmp_path / "snap")
    assert hub.weight_requests() == [] and not (tmp_path / "snap").exists()


def test_too_little_disk_space_is_refused_before_starting(hub, tmp_path):
    info = repo_info(SUPPORTED_REPO)
    total = sum(f.size for f in info.model_files())
    with pytest.raises(SluiceError, match="Not enough disk space"):
        download(info, tmp_path / "snap", free_bytes=lambda path: total - 1)
    assert [p for m, p, r in hub.requests if "/resolve/" in p and m == "GET" and not p.endswith("config.json")] == []
    # the repack's size counts too: room for the download alone is not enough
    with pytest.raises(SluiceError, match="Not enough disk space"):
        download(info, tmp_path / "snap", extra_bytes_needed=10 * total, free_bytes=lambda path: 2 * total)
    download(info, tmp_path / "snap", free_bytes=lambda path: total)


def test_pause_keeps_partial_bytes_and_resume_completes(hub, model_folders, tmp_path):
    info = repo_info(SUPPORTED_REPO)
    size = next(f.size for f in info.files if f.path == WEIGHTS)
    hub.throttle_bps = 2_000_000
    stop = threading.Event()

    def on_progress(p):
        if p.current_file == WEIGHTS and p.bytes_done > size // 4:
            stop.set()
    with pytest.raises(DownloadStopped):
        download(info, tmp_path / "snap", progress=on_progress, stop_event=stop)
    remaining = missing_bytes(info, tmp_path / "snap")
    assert 0 < remaining < size
    hub.throttle_bps = None
    hub.reset_counters()
    download(info, tmp_path / "snap")
    assert hub.body_bytes_sent == remaining
    assert same_files(model_folders[SUPPORTED_REPO], tmp_path / "snap", [WEIGHTS])


def test_gated_repo_needs_the_stored_access_token(hub, model_folders, tmp_path, monkeypatch):
    import huggingface_hub.constants
    from engine.hub.search import save_token, stored_token
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))
    hub.gated[SUPPORTED_REPO] = "hf_secret123"
    with pytest.raises(SluiceError, match="is gated: accept its license .* enter an access token"):
        repo_info(SUPPORTED_REPO)
    save_token("hf_secret123\n")                                  # what the wizard's Access token… button does
    assert stored_token() == "hf_secret123" and (tmp_path / "hf" / "token").stat().st_mode & 0o077 == 0
    info = repo_info(SUPPORTED_REPO)
    download(info, tmp_path / "snap")                            # the token is sent with every file request
    assert same_files(model_folders[SUPPORTED_REPO], tmp_path / "snap", [WEIGHTS])


def test_new_revision_keeps_unchanged_files_and_never_appends_to_old_bytes(hub, model_folders, tmp_path):
    import shutil
    info = repo_info(SUPPORTED_REPO)
    size = next(f.size for f in info.files if f.path == WEIGHTS)
    hub.throttle_bps = 2_000_000
    stop = threading.Event()
    with pytest.raises(DownloadStopped):
        download(info, tmp_path / "snap", stop_event=stop,
                 progress=lambda p: stop.set() if p.current_file == WEIGHTS and p.bytes_done > size // 3 else None)
    hub.throttle_bps = None
    # the owner pushes a new revision: same file names and sizes, the weights' bytes changed
    new_folder = tmp_path / "new-revision"
    shutil.copytree(model_folders[SUPPORTED_REPO], new_folder)
    weights = bytearray((new_folder / WEIGHTS).read_bytes())
    weights[-1000:] = bytes(b ^ 0xFF for b in weights[-1000:])
    (new_folder / WEIGHTS).write_bytes(bytes(weights))
    hub.add_repo(SUPPORTED_REPO, new_folder)
    hub.reset_counters()
    new_info = repo_info(SUPPORTED_REPO)
    assert new_info.revision != info.revision
    download(new_info, tmp_path / "snap")
    assert (tmp_path / "snap" / WEIGHTS).read_bytes() == bytes(weights)
    fetched = {p.rsplit("/", 1)[-1] for m, p, r in hub.requests if m == "GET" and "/resolve/" in p}
    # files finished before the pause (alphabetically before the weights) are unchanged: not fetched again
    assert "chat_template.jinja" not in fetched and "generation_config.json" not in fetched
    assert {WEIGHTS, "tokenizer.json"} <= fetched
    assert [r for m, p, r in hub.requests if p.endswith(WEIGHTS)] == [None]   # from byte 0, not appended


def test_only_what_a_repack_needs_is_downloaded():
    from engine.hub.search import HubFile, RepoInfo
    listing = ["config.json", "generation_config.json", "model-00001-of-00002.safetensors",
               "model-00002-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.json",
               "tokenizer_config.json", "merges.txt", "vocab.json", "LICENSE", "README.md", ".gitattributes",
               "pytorch_model.bin", "original/consolidated.00.pth", "original/params.json",
               "additional_chat_templates/tool_use.jinja", "onnx/model.onnx"]
    info = RepoInfo("o/n", "abc", [HubFile(p, 1, None, "0") for p in listing])
    assert [f.path for f in info.model_files()] == [
        "config.json", "generation_config.json", "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.json",
        "tokenizer_config.json", "merges.txt", "vocab.json", "LICENSE", "additional_chat_templates/tool_use.jinja"]
