"""`-o DIR` / `[tool.mocompile] output`: the launchers find their recipe folder where it was written."""

from __future__ import annotations

from conftest import run_cli

RECIPE = ("schema: 1\nmodel: tiny-moe\nhardware: {gpu: h100, gpus_per_node: 2}\ngoal: bring-up\n"
          "launch: {targets: [torchrun, slurm, kubernetes]}\n")


def _project(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "r.yaml").write_text(RECIPE)


def test_the_launchers_name_the_output_folder_given_with_dash_o(tmp_path):
    _project(tmp_path)
    assert run_cli("compile", "recipes/r.yaml", "-o", "build/gen", cwd=tmp_path).returncode == 0
    out = tmp_path / "build" / "gen" / "r"
    assert "RECIPE_DIR_DEFAULT=build/gen/r\n" in (out / "slurm.sbatch").read_text()
    assert "sbatch build/gen/r/slurm.sbatch" in (out / "slurm.sbatch").read_text()
    job = (out / "trainjob.yaml").read_text()
    assert "bash build/gen/r/preflight.sh" in job and "build/gen/r/train.py" in job and "generated/" not in job
    assert run_cli("check", "recipes/r.yaml", "-o", "build/gen", cwd=tmp_path).returncode == 0
    assert run_cli("check", "recipes/r.yaml", cwd=tmp_path).returncode == 1  # nothing under generated/


def test_the_project_setting_is_the_same_as_dash_o(tmp_path):
    _project(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[tool.mocompile]\noutput = "build/gen"\n')
    assert run_cli("compile", "recipes/r.yaml", cwd=tmp_path).returncode == 0
    assert "RECIPE_DIR_DEFAULT=build/gen/r\n" in (tmp_path / "build" / "gen" / "r" / "slurm.sbatch").read_text()
    # from a subfolder the same project compiles to the same files
    sub = run_cli("check", "../recipes/r.yaml", cwd=tmp_path / "recipes")
    assert sub.returncode == 0, sub.stdout


def test_a_recipe_compiled_by_its_absolute_path_is_current_for_check(tmp_path):
    """The lock keeps project-relative positions, not the path as typed."""
    _project(tmp_path)
    (tmp_path / "recipes" / "r.yaml").write_text(RECIPE + "moe: {dispatcher: alltoall}\n")  # a positioned pin
    assert run_cli("compile", str(tmp_path / "recipes" / "r.yaml"), cwd=tmp_path).returncode == 0
    lock = (tmp_path / "generated" / "r" / "mocompile.lock.json").read_text()
    assert str(tmp_path) not in lock and '"at": "recipes/r.yaml:6:' in lock
    assert run_cli("check", "recipes/r.yaml", cwd=tmp_path).returncode == 0
