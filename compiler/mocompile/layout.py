"""Pipeline layouts (``pipeline_model_parallel_layout``): parse, check, derive.

Grammar (Megatron-Core pipeline_parallel_layer_layout.py): ``|`` splits virtual
stages, ``(...)*n`` and ``x*n`` repeat, commas are cosmetic, letters are
E (embedding), t (decoder layer), m (MTP layer), L (loss).
"""

from __future__ import annotations

import re


class LayoutSyntaxError(ValueError):
    pass


def expand(layout: str, limit: int | None = None) -> list[str]:
    """Expand repeats and return the list of stages, each a string of letters.

    With ``limit``, a layout whose expansion would pass ``limit`` characters (bars included)
    raises ``LayoutSyntaxError`` before the text is built: ``((t*999)*999)*999`` is 20
    characters that would expand to a billion, and nested repeats multiply.
    """
    text = layout.replace(",", "").replace(" ", "")

    def repeat(pattern: str, text: str) -> str:
        size = len(text)  # the length of the text being built, kept before each piece is made

        def one(m: re.Match[str]) -> str:
            nonlocal size
            times = int(m.group(2))
            size += len(m.group(1)) * times - len(m.group(0))
            if limit is not None and size > limit:
                raise LayoutSyntaxError(f"{layout[:60]!r} expands past {limit} characters")
            return m.group(1) * times

        return re.sub(pattern, one, text)

    for _ in range(100):
        new = repeat(r"\(([^()]*)\)\*(\d+)", text)
        if new == text:
            break
        text = new
    text = repeat(r"([EtmL])\*(\d+)", text)
    if re.search(r"[^EtmL|]", text):
        raise LayoutSyntaxError(f"unexpected characters in {layout!r}")
    return text.split("|")


def layout_error(layout: str, pp: int, vpp: int, num_layers: int, mtp: int) -> str | None:
    """Why ``layout`` is illegal for this model and pipeline, or None.

    A legal layout expands to exactly ``num_layers + mtp + 2`` letters and ``pp*vpp - 1`` bars;
    expansion stops at twice that, so a repeat bomb costs no more than a legal layout.
    """
    try:
        stages = expand(layout, limit=2 * (num_layers + mtp + 2 + pp * vpp) + 16)
    except LayoutSyntaxError as exc:
        return str(exc)
    flat = "".join(stages)
    if len(stages) != pp * vpp:
        return f"{len(stages)} stages, but PP*VPP = {pp}*{vpp} = {pp * vpp}"
    if not stages[0].startswith("E") or flat.count("E") != 1:
        return "the first stage must start with the single E"
    if not stages[-1].endswith("L") or flat.count("L") != 1:
        return "the last stage must end with the single L"
    if flat.count("t") != num_layers:
        return f"{flat.count('t')} decoder layers `t`, but the model has {num_layers}"
    if flat.count("m") != mtp:
        return f"{flat.count('m')} MTP layers `m`, but the model has {mtp}"
    if mtp and "m" not in stages[-1]:
        return "MTP layers must sit in the last stage"
    if mtp and "t" in stages[-1][stages[-1].index("m"):]:
        return "MTP layers must come after every decoder layer"
    return None


def derive(pp: int, vpp: int, num_layers: int, mtp: int) -> str:
    """A balanced layout: embedding and loss count as one layer each, MTP too.

    Units are dealt over ``pp*vpp`` stages as evenly as possible; E opens the
    first stage, MTP and L close the last. Repeated middle stages are folded
    into ``(..|)*n`` so the string stays short (e.g. ``Et|(tt|)*30mL``).
    Equal middle stages are counted, never listed one by one: the work does not grow
    with ``pp*vpp``, only the letters of the first, last and one middle stage are built.
    """
    stages_n = pp * vpp
    units = num_layers + 2 + mtp
    base, extra = divmod(units, stages_n)  # the last `extra` stages hold one unit more
    if stages_n == 1:
        return "E" + "t" * num_layers + "m" * mtp + "L"
    runs: list[list] = []  # [stage, how many in a row]

    def add(stage: str, count: int) -> None:
        if count <= 0:
            return
        if runs and runs[-1][0] == stage:
            runs[-1][1] += count
        else:
            runs.append([stage, count])

    first = base + (1 if stages_n - extra <= 0 else 0)
    remaining = num_layers
    t = max(0, min(first - 1, remaining))
    remaining -= t
    add("E" + "t" * t, 1)
    # Middle stages 1 .. stages_n-2: `base` units up to stages_n-extra, then base+1. Each takes
    # min(size, what is left): full stages, then at most one partial one, then empty ones.
    split = min(max(1, stages_n - extra), stages_n - 1)
    for lo, hi, size in ((1, split, base), (split, stages_n - 1, base + 1)):
        count = hi - lo
        if count <= 0:
            continue
        full = count if size == 0 else min(count, remaining // size)
        add("t" * size, full)
        remaining -= full * size
        if full < count:
            add("t" * remaining, 1)
            remaining = 0
            add("", count - full - 1)
    add("t" * remaining + "m" * mtp + "L", 1)
    return _fold(runs)


def _fold(runs: list[list]) -> str:
    out = [f"({stage}|)*{count}" if count > 2 else "|".join([stage] * count) + "|" for stage, count in runs]
    text = "".join(out)
    return text[:-1] if text.endswith("|") else text


def even(pp: int, vpp: int, num_layers: int) -> bool:
    return num_layers % pp == 0 and (num_layers // pp) % vpp == 0


def default(pp: int, vpp: int, num_layers: int, mtp: int) -> str | None:
    """The layout a plan gets when none is pinned: none where Megatron-Core's even split serves (no pipeline, or
    layers that divide evenly and no MTP layer to place), else ``derive``'s balanced one. The planner emits it and
    the memory estimate places each rank's layers by it."""
    if pp == 1 or (even(pp, vpp, num_layers) and not mtp):
        return None
    return derive(pp, vpp, num_layers, mtp)
