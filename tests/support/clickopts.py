"""What a click command passes its callback when only some arguments are given: its defaults.

    passed_options(run, ["--upstream", "http://127.0.0.1:8000"]) -> {"listen": "127.0.0.1:9100", ...}

The options tests (tests/test_*_cli_options.py) compare these with their settings type's defaults.
"""

from __future__ import annotations

from collections.abc import Sequence

import click


def passed_options(command: click.Command, args: Sequence[str] = (), **given: object) -> dict[str, object]:
    """What click passes `command`'s callback for `args`, updated by `given` (the callback is not run)."""
    passed: dict[str, object] = {}
    callback = command.callback
    command.callback = lambda **options: passed.update(options)
    try:
        command.main(list(args), standalone_mode=False)
    finally:
        command.callback = callback
    return passed | given
