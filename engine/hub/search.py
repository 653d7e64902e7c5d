"""The Hugging Face hub, read-only: search, model info, file list and config, before any weight is fetched.

Talks to `HF_ENDPOINT` (read at call time, so tests and mirrors can point it anywhere) through
`huggingface_hub.HfApi`. Downloading files is `engine.hub.download` (our own resuming downloader).
"""
from __future__ import annotations

import functools

import json
import os
import re
from dataclasses import dataclass, field

# huggingface_hub 2.4 otherwise resolves huggingface.co at import for agent detection, even with
# another endpoint; Sluice sends no telemetry anyway. Must be set before huggingface_hub is imported.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from engine.errors import SluiceError  # noqa: E402

DEFAULT_ENDPOINT = "https://huggingface.co"
CONFIG_MAX_BYTES = 4 * 2**20     # config.json larger than this is not a model config
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5", ".onnx")
METADATA_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".tiktoken")   # configs, tokenizers, templates


SEARCH_TIMEOUT_S = 15.0


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/")


def supported_families() -> tuple[str, ...]:
    from engine.model.spec import SUPPORTED_FAMILIES
    return tuple(SUPPORTED_FAMILIES)


@dataclass
class SearchHit:
    repo_id: str
    family: str | None       # config model_type when the hub reports it
    downloads: int
    likes: int

    @property
    def is_supported(self) -> bool:
        return self.family in supported_families()


@dataclass
class HubFile:
    path: str
    size: int
    sha256: str | None       # LFS files: sha256 of the content
    git_sha1: str            # every file: git blob sha1 ("blob <size>\0" + content)

    @property
    def is_weight(self) -> bool:
        return self.path.endswith(WEIGHT_SUFFIXES)


@dataclass
class RepoInfo:
    repo_id: str
    revision: str            # the commit sha the files belong to (a branch name is resolved once)
    files: list[HubFile]
    config: dict = field(default_factory=dict)

    @property
    def family(self) -> str | None:
        return self.config.get("model_type")

    @functools.cached_property
    def is_supported(self) -> bool:
        """A family Sluice lists, or one transformers knows whose experts the generic path streams (day 0)."""
        from engine.model.spec import runs_generically
        return self.family in supported_families() or (bool(self.config) and runs_generically(self.config))

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def model_files(self) -> list[HubFile]:
        """The files a Sluice repack needs: safetensors weights, configs, tokenizer, chat templates.

        Other weight formats (.bin, .gguf, ...) and sub-folders (original/, onnx/) hold copies of the
        same weights in formats Sluice does not read, so they are skipped."""
        keep = []
        for f in self.files:
            if "/" in f.path and not f.path.startswith("additional_chat_templates/"):
                continue
            name = f.path.rsplit("/", 1)[-1]
            if name.endswith(".safetensors") or name == "LICENSE" or (
                    not f.is_weight and name.endswith(METADATA_SUFFIXES)):
                keep.append(f)
        return keep


def parse_repo_ref(text: str) -> tuple[str, str | None]:
    """'owner/name', 'owner/name@rev' or a hub address (…/owner/name[/tree/rev]) -> (repo_id, revision or None)."""
    text = text.strip()
    m = re.fullmatch(r"https?://[^/]+/(?:models/)?([\w.-]+/[\w.-]+?)(?:/(?:tree|blob|resolve)/([^/?#]+)[^?#]*)?/?(?:[?#].*)?", text)
    if m:
        repo_id, revision = m.group(1), m.group(2)
    else:
        repo_id, _, revision = text.partition("@")
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo_id):
        raise SluiceError(f"'{text}' is not a model name: write it as owner/name (for example Qwen/Qwen3-30B-A3B) or paste its hub address.")
    return repo_id, revision or None


def _api(token: str | None = None):
    from huggingface_hub import HfApi
    return HfApi(endpoint=endpoint(), token=token)


def _hub_error(exc: Exception, repo_id: str, revision: str | None) -> SluiceError:
    """One clear sentence for each way the hub can refuse."""
    from huggingface_hub.errors import GatedRepoError, OfflineModeIsEnabled, RepositoryNotFoundError, RevisionNotFoundError
    import httpx2
    if isinstance(exc, OfflineModeIsEnabled):
        return SluiceError("Hub access is switched off (HF_HUB_OFFLINE is set): unset it to search and download models.")
    if isinstance(exc, GatedRepoError):
        return SluiceError(f"{repo_id} is gated: accept its license on the hub's web page, then enter an access token in the setup window.")
    if isinstance(exc, RevisionNotFoundError):
        return SluiceError(f"{repo_id} has no revision '{revision}': leave the revision empty to use the newest one.")
    if isinstance(exc, RepositoryNotFoundError):
        return SluiceError(f"There is no model '{repo_id}' on the hub: check the name, or enter an access token if it is private.")
    if isinstance(exc, httpx2.TransportError):
        return SluiceError(f"Cannot reach the model hub at {endpoint()}: check your network connection and try again.")
    return SluiceError(f"The model hub answered with an error for {repo_id} ({exc}): try again later.")


def search(query: str, limit: int = 30, token: str | None = None) -> list[SearchHit]:
    """Hub search by text, most downloaded first, with the families Sluice runs ahead of the rest.

    One request, no retries: offline, it fails as soon as the network says so (huggingface_hub's list_models
    retries five times, logging each try)."""
    from huggingface_hub import constants, get_session
    from huggingface_hub.utils import build_hf_headers
    import httpx2
    if constants.is_offline_mode():
        raise SluiceError("Hub access is switched off (HF_HUB_OFFLINE is set): unset it to search and download models.")
    params = {"sort": "downloads", "direction": "-1", "limit": str(limit), "config": "True"}
    if query:
        params["search"] = query
    try:
        response = get_session().get(f"{endpoint()}/api/models", params=params, headers=build_hf_headers(token=token),
                                     follow_redirects=True, timeout=SEARCH_TIMEOUT_S)
        response.raise_for_status()
        models = response.json()
    except (httpx2.TransportError, ConnectionError) as exc:
        raise _hub_error(exc, query, None) from exc
    except (httpx2.HTTPStatusError, ValueError) as exc:
        raise SluiceError(f"The model hub answered the search with an error ({exc}): try again later.") from exc
    if not isinstance(models, list):
        raise SluiceError("The model hub answered the search with something that is not a list of models: try again later.")
    hits = [SearchHit(str(m.get("id", "")), (m.get("config") or {}).get("model_type"), m.get("downloads") or 0,
                      m.get("likes") or 0) for m in models if isinstance(m, dict) and m.get("id")]
    hits.sort(key=lambda h: (not h.is_supported, -h.downloads))
    return hits


def repo_info(repo_id: str, revision: str | None = None, token: str | None = None) -> RepoInfo:
    """Commit sha, file list (with hashes) and config.json of a repo: a few kB, no weights."""
    from huggingface_hub.errors import HfHubHTTPError
    import httpx2
    api = _api(token)
    try:
        info = api.model_info(repo_id, revision=revision)
        files = [HubFile(e.path, e.size, e.lfs.sha256 if e.lfs else None, e.blob_id)
                 for e in api.list_repo_tree(repo_id, revision=info.sha, recursive=True)
                 if e.__class__.__name__ == "RepoFile"]
    except (HfHubHTTPError, httpx2.TransportError, ConnectionError) as exc:
        raise _hub_error(exc, repo_id, revision) from exc
    result = RepoInfo(info.id, info.sha, files)
    result.config = _fetch_config(result, token)
    return result


def _fetch_config(info: RepoInfo, token: str | None) -> dict:
    from huggingface_hub import get_session, hf_hub_url
    from huggingface_hub.utils import build_hf_headers
    import httpx2
    entry = next((f for f in info.files if f.path == "config.json"), None)
    if entry is None:
        raise SluiceError(f"{info.repo_id} has no config.json, so it is not a transformers model Sluice can run.")
    if entry.size > CONFIG_MAX_BYTES:
        raise SluiceError(f"{info.repo_id}'s config.json is {entry.size} bytes, too large to be a model config.")
    url = hf_hub_url(info.repo_id, "config.json", revision=info.revision, endpoint=endpoint())
    try:
        response = get_session().get(url, headers=build_hf_headers(token=token), follow_redirects=True, timeout=30)
        response.raise_for_status()
        return json.loads(response.content)
    except (httpx2.TransportError, ConnectionError) as exc:
        raise _hub_error(exc, info.repo_id, info.revision) from exc
    except (httpx2.HTTPStatusError, ValueError) as exc:
        raise SluiceError(f"Could not read {info.repo_id}'s config.json ({exc}): the repo may be broken.") from exc


def save_token(token: str) -> None:
    """Store an access token where huggingface_hub looks for it (HF_TOKEN_PATH), without a network check."""
    from huggingface_hub import constants
    path = constants.HF_TOKEN_PATH
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(token.strip())
    os.chmod(path, 0o600)


def stored_token() -> str | None:
    from huggingface_hub import get_token
    return get_token()
