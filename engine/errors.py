"""The one exception type a user can cause. Its message is a single sentence: what is wrong, what to do.

`user_sentence` turns the failures a user's machine causes (a full or read-only disk, a permission,
a file where a folder should be, memory running out) into such a sentence, naming the path, so the
CLI (exit code 2), the app's dialogs and the server all say the same thing.
"""
from __future__ import annotations

import errno
import os
from contextlib import contextmanager


class SluiceError(Exception):
    """An error the user can fix (bad path, unsupported model, budget too small, no disk space...)."""


_FS_ADVICE = {
    errno.ENOSPC: "the disk is full; free some space or choose a folder on another drive",
    errno.EDQUOT: "your disk quota is used up; free some space or choose a folder on another drive",
    errno.EROFS: "the drive is read-only; choose a folder on a writable drive",
    errno.EACCES: "permission denied; choose a folder you can write to, or fix its permissions",
    errno.EPERM: "the operation is not permitted; choose a folder you can write to, or fix its permissions",
    errno.ENOTDIR: "part of the path is a file, not a folder; choose another folder",
    errno.EISDIR: "a folder is where a file should be; move it away or choose another folder",
}
_ALLOCATION_MARKERS = ("can't allocate memory", "out of memory", "cannot allocate memory", "not enough memory")


def fs_error_sentence(exc: OSError, path=None, then: str = "") -> str | None:
    """One sentence for a file system error a user can fix, or None for other errors.
    `path` names the place when the error carries no file name; `then` is appended (e.g. how to resume)."""
    advice = _FS_ADVICE.get(exc.errno)
    if exc.errno == errno.EEXIST and exc.filename and not os.path.isdir(exc.filename):   # mkdir through a file
        advice = "it is a file where a folder should be; move it away or choose another folder"
    if advice is None:
        return None
    where = exc.filename or path
    place = f"'{where}'" if where is not None else "a file"
    return f"Sluice could not use {place}: {advice}{'; ' + then if then else ''}."


def allocation_sentence(exc: BaseException) -> str | None:
    """One sentence for a failed memory allocation (MemoryError, torch's CPU or CUDA allocator), or None."""
    text = str(exc).lower()
    if isinstance(exc, MemoryError) or (isinstance(exc, OSError) and exc.errno == errno.ENOMEM) \
            or (isinstance(exc, RuntimeError) and any(m in text for m in _ALLOCATION_MARKERS)):
        return ("Sluice ran out of memory; choose a smaller RAM cache or VRAM budget (--ram-cache, --vram-budget, "
                "or Settings), or close other programs.")
    return None


def user_sentence(exc: BaseException) -> str | None:
    """The sentence to show for `exc` when the user can act on it, else None (a bug: log the traceback)."""
    if isinstance(exc, SluiceError):
        return str(exc)
    if isinstance(exc, OSError) and exc.errno != errno.ENOMEM:
        return fs_error_sentence(exc)
    return allocation_sentence(exc)


@contextmanager
def fs_errors_as_sentences(path=None, then: str = ""):
    """Inside: a file system error a user can fix becomes a SluiceError naming the path."""
    try:
        yield
    except OSError as exc:
        sentence = fs_error_sentence(exc, path, then)
        if sentence is None:
            raise
        raise SluiceError(sentence) from exc
