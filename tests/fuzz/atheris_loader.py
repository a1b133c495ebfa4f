"""Coverage-guided byte fuzzing of the loader and schema check with atheris (libFuzzer).

    .venv-stack/bin/python tests/fuzz/atheris_loader.py -runs=100000 [corpus-dir]

Every input is written to a scratch file and loaded and validated; the only acceptable
exception is ``InputError`` (exit 2 in the CLI). Anything else, or an input that takes more
than a second (``-timeout=1``, set below unless given), makes libFuzzer stop with a non-zero
exit and a crash file. The seed corpus is recipes/.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import atheris

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "compiler"))

with atheris.instrument_imports(include=["mocompile"]):
    from mocompile.errors import InputError
    from mocompile.load import load
    from mocompile.schema import validate

SCRATCH = Path(tempfile.mkdtemp(prefix="mocompile-atheris-")) / "fuzz.yaml"


def one_input(data: bytes) -> None:
    SCRATCH.write_bytes(data)
    try:
        validate(load(str(SCRATCH)))
    except InputError as exc:
        assert exc.diagnostics and all(d.rule and d.message for d in exc.diagnostics)


def main() -> None:
    args = list(sys.argv)
    if not any(a.startswith("-timeout=") for a in args):
        args.append("-timeout=1")
    if not any(not a.startswith("-") for a in args[1:]):
        corpus = Path(tempfile.mkdtemp(prefix="mocompile-corpus-"))
        for p in (ROOT / "recipes").rglob("*.yaml"):
            (corpus / p.name).write_bytes(p.read_bytes())
        args.append(str(corpus))
    atheris.Setup(args, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
