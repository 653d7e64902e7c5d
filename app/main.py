"""The `sluice` command: no arguments -> desktop app; `install-launcher` -> launcher; else the engine CLI.

`sluice --exit-after-ms N` opens the app and closes it after N ms (the launcher's smoke test).

Qt is imported only on the GUI path, so command-line use never loads it.
"""
from __future__ import annotations

import sys


EXIT_AFTER_FLAG = "--exit-after-ms"


def _exit_after_ms(args: list[str]) -> int | None:
    """N of `--exit-after-ms N`, None without the flag, -1 when N is not a number of milliseconds."""
    if not args:
        return None
    return int(args[1]) if len(args) == 2 and args[1].isdigit() else -1


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] == EXIT_AFTER_FLAG:
        exit_after_ms = _exit_after_ms(args)
        from .display_check import display_problem
        problem = display_problem() if exit_after_ms != -1 else "--exit-after-ms takes a number of milliseconds."
        if problem:
            print(f"sluice: {problem}", file=sys.stderr)
            return 2
        from .gui import run_gui
        return run_gui(exit_after_ms)
    if args == ["install-launcher"]:
        from .launcher import main as install_launcher_main
        return install_launcher_main()
    from engine.setup import run_cli as cli_main
    return cli_main(args)


if __name__ == "__main__":
    sys.exit(main())
