"""Before Qt starts: can a window be shown here? Qt itself would abort with a page of plugin jargon."""
from __future__ import annotations

import ctypes.util
import os
import sys


def display_problem(environ=os.environ, platform: str = sys.platform, find_library=ctypes.util.find_library) -> str | None:
    """One sentence saying why no window can open on this Linux session, or None when it can (or we cannot tell)."""
    if not platform.startswith("linux") or environ.get("QT_QPA_PLATFORM"):
        return None
    if not environ.get("DISPLAY") and not environ.get("WAYLAND_DISPLAY"):
        return ("No graphical display was found (DISPLAY and WAYLAND_DISPLAY are not set): start Sluice from a "
                "desktop session, or use the command line (`sluice --help`).")
    if not environ.get("WAYLAND_DISPLAY") and find_library("xcb-cursor") is None:
        return ("The X11 library libxcb-cursor is missing, and Qt needs it to open a window: install it "
                "(Debian/Ubuntu: sudo apt install libxcb-cursor0) and start Sluice again.")
    return None
