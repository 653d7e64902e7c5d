"""App tests: real widgets (offscreen), real SQLite, the real engine on the demo model."""
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402
from app_helpers import SMALL_BUDGETS, WAIT_MS, make_window  # noqa: E402

@pytest.fixture(autouse=True)
def no_qthread_left_running():
    """Fail a test that leaves an engine thread running (it must be shut down, e.g. by closing the window)."""
    yield
    from app.worker import LIVE_HOSTS
    running = [host for host in list(LIVE_HOSTS) if host.thread.isRunning()]
    for host in running:
        host.shutdown()
    assert not running, f"{len(running)} engine QThread(s) left running after the test"


@pytest.fixture(scope="session")
def demo_model(tmp_path_factory):
    from engine.tools.demo import build_demo_model
    return build_demo_model(tmp_path_factory.mktemp("demo") / "sluice-demo")


@pytest.fixture
def loaded_window(qtbot, data_dir, demo_model):
    """The main window with the demo model loaded through the engine thread, budgets small enough to stream."""
    window = make_window(qtbot, data_dir, **SMALL_BUDGETS)
    with qtbot.waitSignal(window.model_loaded, timeout=WAIT_MS):
        window.load_model(demo_model)
    yield window
    assert window.shutdown()
