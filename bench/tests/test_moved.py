"""The benchmark lives in the repository, not in the installed package."""

from pathlib import Path

from streampool import __main__ as cli

PACKAGE = Path(cli.__file__).resolve().parent


def test_the_package_has_no_benchmark_module():
    # The wheel packs python/streampool/ whole: no bench.py there, no bench.py in the wheel.
    assert not (PACKAGE / "bench.py").exists() and not (PACKAGE / "bench").exists()


def test_the_old_subcommand_points_to_the_repository_tool(capsys):
    assert cli.main(["bench", "--quick"]) == 2
    assert capsys.readouterr().err.strip() == cli.BENCH_MOVED
    assert "python3 -m bench" in cli.BENCH_MOVED
