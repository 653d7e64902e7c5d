"""The desktop launcher: a valid freedesktop entry, installed where menus and desktops look, that starts the app."""
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app import launcher
from app.paths import APP_ID

ROOT = Path(__file__).resolve().parents[2]
needs_validator = pytest.mark.skipif(shutil.which("desktop-file-validate") is None,
                                     reason="desktop-file-validate is not installed (apt-get install desktop-file-utils)")


def _validate(path: Path) -> None:
    result = subprocess.run(["desktop-file-validate", str(path)], capture_output=True, text=True)
    assert result.returncode == 0 and "error" not in result.stdout, result.stdout


@needs_validator
def test_the_packaged_desktop_file_is_valid():
    _validate(ROOT / "packaging" / "sluice.desktop")


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "home" / ".local" / "share"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home" / ".config"))
    monkeypatch.delenv("XDG_DESKTOP_DIR", raising=False)
    return tmp_path / "home"


def _exec_line(entry: Path) -> list[str]:
    line = next(l for l in entry.read_text().splitlines() if l.startswith("Exec="))
    return shlex.split(line.removeprefix("Exec=").replace("%%", "%"))


def test_install_launcher_puts_it_in_the_menu_and_on_the_desktop(home):
    (home / ".config").mkdir(parents=True)
    (home / ".config" / "user-dirs.dirs").write_text('XDG_DESKTOP_DIR="$HOME/Schreibtisch"\n')   # a localized desktop
    written = launcher.install_linux()
    menu = home / ".local" / "share" / "applications" / f"{APP_ID}.desktop"
    desktop = home / "Schreibtisch" / f"{APP_ID}.desktop"
    icon = home / ".local" / "share" / "icons" / "hicolor" / "scalable" / "apps" / f"{APP_ID}.svg"
    assert set(written) == {menu, desktop, icon}
    assert menu.read_text() == desktop.read_text() and os.access(desktop, os.X_OK)
    command = _exec_line(menu)
    assert Path(command[0]).is_absolute() and Path(command[0]).exists()
    assert f"Icon={icon}" in menu.read_text()
    if shutil.which("desktop-file-validate"):
        _validate(menu)


def test_exec_with_spaces_is_quoted_by_the_spec(home, monkeypatch):
    monkeypatch.setenv("XDG_DESKTOP_DIR", str(home / "Desk top"))
    launcher.install_linux(["/opt/my apps/sluice"])
    entry = home / "Desk top" / f"{APP_ID}.desktop"
    assert 'Exec="/opt/my apps/sluice"' in entry.read_text()
    assert _exec_line(entry) == ["/opt/my apps/sluice"]


def test_the_installed_exec_line_starts_the_app(home, tmp_path):
    """Run the Exec command of the installed entry, as a desktop would (offscreen, closing itself after 1.5 s)."""
    sluice = Path(sys.executable).with_name("sluice")
    command = [str(sluice)] if sluice.exists() else None
    launcher.install_linux(command)
    argv = _exec_line(home / ".local" / "share" / "applications" / f"{APP_ID}.desktop")
    data_dir = tmp_path / "launched"
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "SLUICE_DATA_DIR": str(data_dir)}
    result = subprocess.run(argv + ["--exit-after-ms", "1500"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (data_dir / "sluice.db").is_file()            # the app opened its chat store


def test_macos_bundle_runs_the_sluice_command(tmp_path):
    bundle, = launcher.install_macos(["/usr/local/bin/sluice"], applications_dir=tmp_path)
    script = bundle / "Contents" / "MacOS" / "Sluice"
    assert "exec '/usr/local/bin/sluice'" in script.read_text() and os.access(script, os.X_OK)
    assert "<string>io.github.sluice.Sluice</string>" in (bundle / "Contents" / "Info.plist").read_text()


def test_sluice_install_launcher_command(home):
    from app.main import main
    assert main(["install-launcher"]) == 0
    assert (home / "Desktop" / f"{APP_ID}.desktop").is_file()


def test_command_line_use_does_not_load_qt():
    code = "import sys, app.main, app.launcher; print('PySide6' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
    # the CLI path itself: argument errors come from engine.tools.cli, still without Qt
    code = ("import sys\nfrom app.main import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('PySide6' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().endswith("False") and "usage" in out.stdout.lower(), out.stdout + out.stderr


def test_the_app_identifies_itself_as_the_launcher(qapp):
    from app.gui import create_application
    app = create_application()
    entry = (ROOT / "packaging" / "sluice.desktop").read_text()
    assert app.desktopFileName() == APP_ID and f"Icon={APP_ID}" in entry
    assert f"StartupWMClass={app.applicationName()}" in entry           # X11 WM_CLASS is the application name
    assert (ROOT / "resources" / f"{APP_ID}.svg").is_file()


def test_install_says_when_the_disk_is_too_full_before_installing_anything(tmp_path):
    """With too little free disk the installer stops with one sentence, before it creates .venv (pip would
    fill the disk halfway and stop with an OSError)."""
    root = tmp_path / "Sluice"
    (root / "packaging").mkdir(parents=True)
    shutil.copy(ROOT / "packaging" / "install.sh", root / "packaging" / "install.sh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_df = bin_dir / "df"                       # df -Pm: 287 MB available
    fake_df.write_text("#!/bin/sh\necho 'Filesystem 1048576-blocks Used Available Capacity Mounted on'\n"
                       "echo '/dev/vda 258048 257761 287 100% /'\n")
    fake_df.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": sys.executable}
    result = subprocess.run(["bash", str(root / "packaging" / "install.sh"), "--dev"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and not (root / ".venv").exists()
    assert result.stderr.strip().count("\n") == 0                      # one sentence, no traceback
    assert "needs about 3.5 GB free" in result.stderr and "only 287 MB is free" in result.stderr
