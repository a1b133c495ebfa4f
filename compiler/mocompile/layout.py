"""Pipeline layouts (``pipeline_model_parallel_layout``): parse, check, derive.

Grammar (Megatron-Core pipeline_parallel_layer_layout.py): ``|`` splits virtual
stages, ``(...)*n`` and ``x*n`` repeat, commas are cosmetic, letters are
E (embedding), t (decoder layer), m (MTP layer), L (loss).
"""

from __future__ import annotations

import re


class LayoutSyntaxError(ValueError):
    pass


def expand(layout: str) -> list[str]:
    """Expand repeats and return the list of stages, each a string of letters."""
    text = layout.replace(",", "").replace(" ", "")
    pattern = re.compile(r"\(([^()]*)\)\*(\d+)")
    for _ in range(100):
        new = pattern.sub(lambda m: m.group(1) * int(m.group(2)), text)
        if new == text:
            break
        text = new
    text = re.sub(r"([EtmL])\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    if re.search(r"[^EtmL|]", text):
        raise LayoutSyntaxError(f"unexpected characters in {layout!r}")
    return text.split("|")


def layout_error(layout: str, pp: int, vpp: int, num_layers: int, mtp: int) -> str | None:
    """Why ``layout`` is illegal for this model and pipeline, or None."""
    try:
        stages = expand(layout)
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
    """
    stages_n = pp * vpp
    units = num_layers + 2 + mtp
    base, extra = divmod(units, stages_n)
    sizes = [base + (1 if i >= stages_n - extra else 0) for i in range(stages_n)]
    # Give larger stages to the middle, never to the first/last, when uneven.
    stages: list[str] = []
    remaining = num_layers
    for i, size in enumerate(sizes):
        head = "E" if i == 0 else ""
        tail = ("m" * mtp + "L") if i == stages_n - 1 else ""
        t = size - len(head) - len(tail)
        t = max(0, min(t, remaining))
        if i == stages_n - 1:
            t = remaining
        remaining -= t
        stages.append(head + "t" * t + tail)
    return _fold(stages)


def _fold(stages: list[str]) -> str:
    out: list[str] = []
    i = 0
    while i < len(stages):
        j = i
        while j + 1 < len(stages) and stages[j + 1] == stages[i]:
            j += 1
        count = j - i + 1
        out.append(f"({stages[i]}|)*{count}" if count > 2 else "|".join(stages[i:j + 1]) + "|")
        i = j + 1
    text = "".join(out)
    return text[:-1] if text.endswith("|") else text


def even(pp: int, vpp: int, num_layers: int) -> bool:
    return num_layers % pp == 0 and (num_layers // pp) % vpp == 0
