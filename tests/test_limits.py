"""Input limits: hostile or runaway recipes exit 2 at once, with a position and a LIM rule ID.

Each case runs the real command line (exit code, message, no traceback) and times the loader
in-process (< 1 s even on a busy 2-CPU machine); boundary cases show the value just inside
each limit still loads.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from conftest import run_cli

GOOD = "schema: 1\nmodel: qwen3-30b-a3b\nhardware: {gpu: h100, nodes: 1}\ngoal: throughput\n"


def _load(path: Path, sets: list[str] | None = None):
    from mocompile.load import load
    return load(str(path), sets)


def _refused(path: Path, rule: str, where: str, sets: list[str] | None = None) -> None:
    """``path`` is refused with ``rule`` at ``where`` (file:line:col), in < 1 s, by the CLI too."""
    from mocompile.errors import InputError
    start = time.perf_counter()
    with pytest.raises(InputError) as err:
        _load(path, sets)
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"took {elapsed:.2f} s"
    (diag,) = err.value.diagnostics
    assert diag.rule == rule
    assert str(diag.position) == where
    args = ["lint", str(path)] + [a for s in sets or [] for a in ("--set", s)]
    proc = run_cli(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert f"{where}: error [{rule}]" in out
    assert "Traceback" not in out and "internal error" not in out


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """The issue's bomb: each level lists the previous one ``width`` times (under 1 KB)."""
    lines = [GOOD.rstrip("\n"), "x0: &a0 [" + ", ".join(["x"] * width) + "]"]
    lines += [f"x{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_without_expanding(tmp_path):
    text = alias_bomb()
    assert len(text) < 1024
    (tmp_path / "bomb.yaml").write_text(text)
    # 9 + 81 + 729 + 6561 values, then level 5's fourth *a3 passes 20,000: line 9, column 15
    _refused(tmp_path / "bomb.yaml", "LIM004", f"{tmp_path / 'bomb.yaml'}:9:15")


def test_aliases_that_stay_small_still_load(tmp_path):
    (tmp_path / "a.yaml").write_text(GOOD + "launch: {env: &e {A: '1'}}\nx: [*e, *e]\n")
    doc = _load(tmp_path / "a.yaml")
    assert doc.data["x"] == [{"A": "1"}, {"A": "1"}]


def test_ten_megabyte_file_is_refused_by_size(tmp_path):
    (tmp_path / "big.yaml").write_text(GOOD + "# " + "a" * 10_000_000 + "\n")
    _refused(tmp_path / "big.yaml", "LIM001", f"{tmp_path / 'big.yaml'}:1:1")


def test_file_just_under_the_size_limit_loads(tmp_path):
    from mocompile.limits import FILE_BYTES
    pad = FILE_BYTES.value - len(GOOD) - 3
    (tmp_path / "ok.yaml").write_text(GOOD + "# " + "a" * pad + "\n")
    assert os.path.getsize(tmp_path / "ok.yaml") == FILE_BYTES.value
    assert _load(tmp_path / "ok.yaml").data["goal"] == "throughput"


def test_ten_thousand_deep_list_is_refused(tmp_path):
    (tmp_path / "deep.yaml").write_text(GOOD + "x: " + "[" * 10_000 + "]" * 10_000 + "\n")
    # depth 1 is the top mapping, so the 32nd `[` (column 3 + 32) is the 33rd level
    _refused(tmp_path / "deep.yaml", "LIM003", f"{tmp_path / 'deep.yaml'}:5:35")


def test_nesting_at_the_depth_limit_loads(tmp_path):
    (tmp_path / "ok.yaml").write_text(GOOD + "x: " + "[" * 31 + "]" * 31 + "\n")
    assert _load(tmp_path / "ok.yaml").data["x"] is not None


def test_alias_carries_its_depth(tmp_path):
    deep = "[" * 20 + "]" * 20
    (tmp_path / "d.yaml").write_text(GOOD + f"a: &d {deep}\nb: " + "[" * 12 + "*d" + "]" * 12 + "\n")
    _refused(tmp_path / "d.yaml", "LIM003", f"{tmp_path / 'd.yaml'}:6:16")


def test_hundred_file_extends_chain_is_refused_at_the_ninth_base(tmp_path):
    for i in range(100):
        head = f"extends: c{i + 1}.yaml\n" if i < 99 else GOOD
        (tmp_path / f"c{i}.yaml").write_text(head + f"name: c{i}\n")
    _refused(tmp_path / "c0.yaml", "LIM008", f"{tmp_path / 'c8.yaml'}:1:10")


def test_eight_bases_are_allowed(tmp_path):
    for i in range(9):
        head = f"extends: c{i + 1}.yaml\n" if i < 8 else GOOD
        (tmp_path / f"c{i}.yaml").write_text(head + f"name: c{i}\n")
    doc = _load(tmp_path / "c0.yaml")
    assert len(doc.files) == 9 and doc.data["name"] == "c0"


def test_extends_cycle_names_the_chain(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n" + GOOD)
    (tmp_path / "b.yaml").write_text("extends: ./a.yaml\n" + GOOD)
    _refused(tmp_path / "a.yaml", "LIM009", f"{tmp_path / 'b.yaml'}:1:10")


def test_self_extends_is_a_cycle(tmp_path):
    (tmp_path / "a.yaml").write_text(GOOD + "extends: a.yaml\n")
    _refused(tmp_path / "a.yaml", "LIM009", f"{tmp_path / 'a.yaml'}:5:10")


def _project(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    (proj / "recipes").mkdir(parents=True)
    (proj / "pyproject.toml").write_text("[tool.mocompile]\n")
    (tmp_path / "outside.yaml").write_text(GOOD)
    (proj / "base.yaml").write_text(GOOD)
    return proj


def test_extends_outside_the_project_root_is_refused(tmp_path):
    proj = _project(tmp_path)
    (proj / "recipes" / "r.yaml").write_text("extends: ../../outside.yaml\nname: r\n")
    _refused(proj / "recipes" / "r.yaml", "LIM010", f"{proj / 'recipes' / 'r.yaml'}:1:10")


def test_extends_by_absolute_path_outside_is_refused(tmp_path):
    proj = _project(tmp_path)
    (proj / "recipes" / "r.yaml").write_text("name: r\nextends: /etc/passwd\n")
    _refused(proj / "recipes" / "r.yaml", "LIM010", f"{proj / 'recipes' / 'r.yaml'}:2:10")


def test_symlink_inside_the_project_to_a_file_outside_is_refused(tmp_path):
    proj = _project(tmp_path)
    (proj / "recipes" / "link.yaml").symlink_to(tmp_path / "outside.yaml")
    (proj / "recipes" / "r.yaml").write_text("extends: link.yaml\nname: r\n")
    _refused(proj / "recipes" / "r.yaml", "LIM010", f"{proj / 'recipes' / 'r.yaml'}:1:10")


def test_bases_anywhere_inside_the_project_are_allowed_also_through_symlinks(tmp_path):
    proj = _project(tmp_path)
    (proj / "recipes" / "link.yaml").symlink_to(proj / "base.yaml")
    (proj / "recipes" / "r.yaml").write_text("extends: ../base.yaml\nname: r\n")
    (proj / "recipes" / "s.yaml").write_text("extends: link.yaml\nname: s\n")
    assert _load(proj / "recipes" / "r.yaml").data["goal"] == "throughput"
    assert _load(proj / "recipes" / "s.yaml").data["goal"] == "throughput"


def test_without_a_project_marker_the_root_is_the_recipes_folder(tmp_path):
    from mocompile.load import project_root
    (tmp_path / "sub").mkdir()
    if any((p / m).exists() for p in [tmp_path, *tmp_path.parents] for m in ("pyproject.toml", ".git")):
        pytest.skip("a project marker sits above the temporary folder")
    assert project_root(str(tmp_path / "sub" / "r.yaml")) == str((tmp_path / "sub").resolve())


def test_fifo_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "pipe.yaml")
    _refused(tmp_path / "pipe.yaml", "LIM002", f"{tmp_path / 'pipe.yaml'}")


def test_directory_is_refused(tmp_path):
    (tmp_path / "d.yaml").mkdir()
    _refused(tmp_path / "d.yaml", "LIM002", f"{tmp_path / 'd.yaml'}")


def test_long_string_is_refused_and_one_at_the_limit_loads(tmp_path):
    (tmp_path / "long.yaml").write_text(GOOD + "launch: {container: " + "a" * 4097 + "}\n")
    _refused(tmp_path / "long.yaml", "LIM006", f"{tmp_path / 'long.yaml'}:5:21")
    (tmp_path / "ok.yaml").write_text(GOOD + "launch: {container: " + "a" * 4096 + "}\n")
    assert len(_load(tmp_path / "ok.yaml").data["launch"]["container"]) == 4096


def test_mapping_with_too_many_keys_is_refused(tmp_path):
    keys = "".join(f"  K{i}: '1'\n" for i in range(1001))
    (tmp_path / "keys.yaml").write_text(GOOD + "launch:\n  env:\n" + keys.replace("  K", "    K"))
    _refused(tmp_path / "keys.yaml", "LIM005", f"{tmp_path / 'keys.yaml'}:1007:5")
    keys = "".join(f"    K{i}: '1'\n" for i in range(1000))
    (tmp_path / "ok.yaml").write_text(GOOD + "launch:\n  env:\n" + keys)
    assert len(_load(tmp_path / "ok.yaml").data["launch"]["env"]) == 1000


@pytest.mark.parametrize("text", [str(2 ** 53 + 1), "-9007199254740993", "0x20000000000001", ".inf", "-.inf",
                                  ".nan", "1e400", "9.1e15", "9" * 4000])
def test_numbers_no_field_accepts_are_refused(tmp_path, text):
    (tmp_path / "n.yaml").write_text(GOOD + f"training: {{seed: {text}}}\n")
    _refused(tmp_path / "n.yaml", "LIM007", f"{tmp_path / 'n.yaml'}:5:18")


def test_largest_integer_loads(tmp_path):
    (tmp_path / "n.yaml").write_text(GOOD + f"training: {{seed: {2 ** 53}}}\n")
    assert _load(tmp_path / "n.yaml").data["training"]["seed"] == 2 ** 53


def test_non_utf8_byte_is_positioned(tmp_path):
    (tmp_path / "b.yaml").write_bytes(GOOD.encode() + b"name: caf\xe9\n")
    _refused(tmp_path / "b.yaml", "INPUT", f"{tmp_path / 'b.yaml'}:5:10")


def test_list_as_a_key_is_positioned(tmp_path):
    (tmp_path / "k.yaml").write_text(GOOD + "? [a, b]\n: 1\n")
    _refused(tmp_path / "k.yaml", "INPUT", f"{tmp_path / 'k.yaml'}:5:3")


def test_alias_bomb_on_the_command_line_is_refused(tmp_path):
    (tmp_path / "r.yaml").write_text(GOOD)
    bomb = "[" + ", ".join(f"&a{i} [" + ", ".join([f"*a{i - 1}" if i else "x"] * 9) + "]" for i in range(9)) + "]"
    from mocompile.errors import InputError
    start = time.perf_counter()
    with pytest.raises(InputError) as err:
        _load(tmp_path / "r.yaml", [f"launch.env={bomb}"])
    assert time.perf_counter() - start < 1.0
    assert err.value.diagnostics[0].rule == "LIM004"
    proc = run_cli("lint", str(tmp_path / "r.yaml"), "--set", f"launch.env={bomb}")
    assert proc.returncode == 2 and "[LIM004]" in proc.stdout + proc.stderr


def test_overlong_set_value_is_refused(tmp_path):
    (tmp_path / "r.yaml").write_text(GOOD)
    _refused(tmp_path / "r.yaml", "LIM006", "<command line>", sets=["launch.container=" + "a" * 5000])


def test_every_limit_is_documented_in_the_readme():
    from mocompile.limits import ALL
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    for limit in ALL:
        assert f"`{limit.id}`" in readme, limit.id


def test_loading_many_recipes_in_one_process_keeps_memory_flat():
    """A shared YAML loader used to keep every document it read (24 GB in a long fuzz run)."""
    import tracemalloc
    recipe = Path(__file__).resolve().parent.parent / "recipes" / "tiny-moe-h100x2.yaml"
    for _ in range(30):
        _load(recipe)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(300):
            _load(recipe)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 512 * 1024, f"{grown / 1e6:.1f} MB kept by 300 loads"


def test_an_alias_counts_every_value_of_the_node_it_names_exactly():
    """`&x [1, 2, 3]` is four values (the list and its items): each `*x` adds four. The document below
    holds 8 + 4k values, so k = 4998 aliases reach the 20,000 limit exactly and one more passes it."""
    from mocompile.errors import InputError
    from mocompile.load import parse_text

    def doc(k: int) -> str:
        return "a: &x [1, 2, 3]\nb: [" + ", ".join(["*x"] * k) + "]\n"

    assert 8 + 4 * 4998 == 20_000
    parse_text(doc(4998), "r.yaml")
    with pytest.raises(InputError) as exc:
        parse_text(doc(4999), "r.yaml")
    assert exc.value.diagnostics[0].rule == "LIM004"
