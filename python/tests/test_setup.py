"""`pip install .` without a suitable Rust stops at once with one line naming the version needed and
how to get it (setup.py's rust_problem), not setuptools-rust's "can't find Rust compiler"."""

import runpy
import subprocess
from pathlib import Path

SETUP = runpy.run_path(str(Path(__file__).resolve().parents[2] / "setup.py"), run_name="setup_under_test")
rust_problem, rust_version_needed = SETUP["rust_problem"], SETUP["rust_version_needed"]


def tools(*present):
    return lambda name: f"/opt/rust/bin/{name}" if name in present else None


def rustc_says(stdout, returncode=0, stderr=""):
    def run(command, **_):
        assert command == ["rustc", "--version"]
        return subprocess.CompletedProcess(command, returncode, stdout, stderr)

    return run


def test_the_version_needed_is_cargo_toml_s_rust_version(tmp_path):
    toml = tmp_path / "Cargo.toml"
    toml.write_text('[package]\nname = "x"\nrust-version = "1.91"\n')
    assert rust_version_needed(str(toml)) == "1.91"


def test_no_cargo_names_the_version_and_rustup():
    problem = rust_problem("1.88", which=tools("rustc"), run=rustc_says("rustc 1.95.0"))
    assert problem.startswith("building streampool needs Rust 1.88 or newer with cargo, and cargo is not on PATH")
    assert "https://rustup.rs" in problem and "\n" not in problem


def test_an_old_rustc_says_which_it_is_and_how_to_update():
    problem = rust_problem("1.88", which=tools("cargo", "rustc"), run=rustc_says("rustc 1.63.0 (4b91a6ea7 2022-08-08)\n"))
    assert "this rustc (/opt/rust/bin/rustc) is 1.63.0" in problem and "rustup update" in problem
    assert rust_problem("1.88", which=tools("cargo", "rustc"), run=rustc_says("rustc 1.87.9")) is not None
    # Versions compare as numbers, not text ("1.9" sorts after "1.88" as text).
    assert rust_problem("1.88", which=tools("cargo", "rustc"), run=rustc_says("rustc 1.9.0")) is not None


def test_the_needed_version_or_newer_builds():
    for found in ("rustc 1.88.0 (6b00bc388 2025-06-23)", "rustc 1.95.0", "rustc 1.100.0", "rustc 2.0.0"):
        assert rust_problem("1.88", which=tools("cargo", "rustc"), run=rustc_says(found)) is None, found


def test_a_rustc_that_fails_says_so():
    problem = rust_problem("1.88", which=tools("cargo", "rustc"),
                           run=rustc_says("", 1, "error: toolchain 'stable' is not installed"))
    assert "toolchain 'stable' is not installed" in problem and "1.88" in problem
