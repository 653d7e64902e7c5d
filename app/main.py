"""The `sluice` command: no arguments -> desktop app; `install-launcher` -> launcher; else the engine CLI.

Qt is imported only on the GUI path, so command-line use never loads it.
"""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args:
        from .display_check import display_problem
        problem = display_problem()
        if problem:
            print(f"sluice: {problem}", file=sys.stderr)
            return 2
        from .gui import run_gui
        return run_gui()
    if args == ["install-launcher"]:
        from .launcher import main as install_launcher_main
        return install_launcher_main()
    from engine.setup import run_cli as cli_main
    return cli_main(args)


if __name__ == "__main__":
    sys.exit(main())
