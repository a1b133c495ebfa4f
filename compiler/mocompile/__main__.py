"""Allow ``python -m mocompile``."""

from mocompile.cli import main

raise SystemExit(main())
