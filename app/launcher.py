"""`sluice install-launcher`: put Sluice in the applications menu and on the desktop. Qt-free.

Linux: a freedesktop entry (from packaging/sluice.desktop) with an absolute Exec path, installed into
$XDG_DATA_HOME/applications and the XDG desktop dir, plus the SVG icon into the hicolor theme.
macOS: a small Sluice.app bundle in ~/Applications whose executable runs the sluice command.
Windows: Start-menu and desktop shortcuts made by PowerShell (packaging/windows/install-shortcut.ps1).
"""
from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from .paths import APP_ID, APP_NAME, RESOURCES_DIR

PACKAGING_DIR = Path(__file__).resolve().parent.parent / "packaging"
TEMPLATE = PACKAGING_DIR / "sluice.desktop"


def sluice_command() -> list[str]:
    """Absolute command that starts the app: the `sluice` console script, else `python -m app.main`."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if argv0 is not None and argv0.stem == "sluice" and argv0.exists():
        return [str(argv0.absolute())]
    candidates = [Path(sys.executable).with_name("sluice"), Path(sys.executable).with_name("sluice.exe")]
    for candidate in candidates:
        if candidate.exists():
            return [str(candidate)]
    found = shutil.which("sluice")
    if found:
        return [str(Path(found).absolute())]
    return [str(Path(sys.executable).absolute()), "-m", "app.main"]


def _quote_exec_arg(arg: str) -> str:
    # Desktop Entry spec: quote args holding reserved characters; inside quotes escape " ` $ and \.
    if re.fullmatch(r"[A-Za-z0-9_./+:=@%-]+", arg):
        return arg.replace("%", "%%")
    return '"' + re.sub(r'([\\"`$])', r"\\\1", arg).replace("%", "%%") + '"'


def desktop_entry(command: list[str], icon: str) -> str:
    """The template with Exec/TryExec pointing at `command` and Icon at `icon`."""
    lines = []
    for line in TEMPLATE.read_text().splitlines():
        if line.startswith("Exec="):
            line = "Exec=" + " ".join(_quote_exec_arg(a) for a in command)
        elif line.startswith("TryExec="):
            line = "TryExec=" + command[0]
        elif line.startswith("Icon="):
            line = "Icon=" + icon
        lines.append(line)
    return "\n".join(lines) + "\n"


def _xdg_data_home() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")


def desktop_dir() -> Path:
    """XDG_DESKTOP_DIR from the environment or user-dirs.dirs, else ~/Desktop."""
    value = os.environ.get("XDG_DESKTOP_DIR")
    if not value:
        config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "user-dirs.dirs"
        if config.is_file():
            match = re.search(r'^XDG_DESKTOP_DIR="?([^"\n]+)"?', config.read_text(), re.MULTILINE)
            value = match.group(1) if match else None
    if value:
        return Path(value.replace("$HOME", str(Path.home())))
    return Path.home() / "Desktop"


def install_linux(command: list[str] | None = None) -> list[Path]:
    command = command or sluice_command()
    data_home = _xdg_data_home()
    icon = data_home / "icons" / "hicolor" / "scalable" / "apps" / f"{APP_ID}.svg"
    icon.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(RESOURCES_DIR / f"{APP_ID}.svg", icon)
    text = desktop_entry(command, str(icon))
    menu_entry = data_home / "applications" / f"{APP_ID}.desktop"
    desktop_entry_path = desktop_dir() / f"{APP_ID}.desktop"
    written = [icon]
    for path in (menu_entry, desktop_entry_path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)   # desktops want +x
        written.append(path)
    _best_effort(["gio", "set", str(desktop_entry_path), "metadata::trusted", "true"])   # GNOME: allow launch
    _best_effort(["update-desktop-database", str(menu_entry.parent)])
    return written


def install_macos(command: list[str] | None = None, applications_dir: Path | None = None) -> list[Path]:
    command = command or sluice_command()
    bundle = (applications_dir or Path.home() / "Applications") / f"{APP_NAME}.app"
    macos_dir = bundle / "Contents" / "MacOS"
    macos_dir.mkdir(parents=True, exist_ok=True)
    (bundle / "Contents" / "Resources").mkdir(exist_ok=True)
    plist = (PACKAGING_DIR / "macos" / "Info.plist").read_text()
    (bundle / "Contents" / "Info.plist").write_text(plist)
    shutil.copyfile(RESOURCES_DIR / f"{APP_ID}.svg", bundle / "Contents" / "Resources" / f"{APP_ID}.svg")
    script = macos_dir / APP_NAME
    quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in command)
    script.write_text(f"#!/bin/sh\nexec {quoted} \"$@\"\n")
    script.chmod(0o755)
    return [bundle]


def install_windows(command: list[str] | None = None) -> list[Path]:
    pythonw = Path(sys.executable).with_name("pythonw.exe")
    # pythonw: a GUI start without a console window (sluice.exe is a console program)
    command = command or ([str(pythonw), "-m", "app.main"] if pythonw.exists() else sluice_command())
    target = command[0]
    arguments = subprocess.list2cmdline(command[1:])
    ps1 = PACKAGING_DIR / "windows" / "install-shortcut.ps1"
    subprocess.run(["powershell", "-NoProfile", "-ExecutionPolicy", "Bypass", "-File", str(ps1),
                    "-Target", target, "-Arguments", arguments or " ",
                    "-Icon", str(RESOURCES_DIR / f"{APP_ID}.ico")], check=True)
    return [Path(os.environ.get("APPDATA", "")) / "Microsoft/Windows/Start Menu/Programs/Sluice.lnk"]


def install_launcher() -> list[Path]:
    if sys.platform == "darwin":
        return install_macos()
    if sys.platform == "win32":
        return install_windows()
    return install_linux()


def _best_effort(args: list[str]) -> None:
    if shutil.which(args[0]):
        subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def main() -> int:
    for path in install_launcher():
        print(f"installed {path}")
    return 0
