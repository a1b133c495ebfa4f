"""One exception per outcome, mapped to the CLI's exit codes in one place."""

from __future__ import annotations

from mocompile.ir import Diagnostic

EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_INPUT = 2
EXIT_INTERNAL = 3


class InputError(Exception):
    """The input cannot be compiled at all (bad YAML, schema errors, missing file)."""

    exit_code = EXIT_INPUT

    def __init__(self, diagnostics: list[Diagnostic]):
        super().__init__("; ".join(d.message for d in diagnostics))
        self.diagnostics = diagnostics


class UsageError(Exception):
    """The command line itself is wrong."""

    exit_code = EXIT_INPUT
