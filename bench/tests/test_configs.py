"""Configurations: what each child's environment holds, variants, the workloads each runs, the
co-tenant's configurations of A, and the child's refusal of STREAMPOOL_* variables its library
does not read."""

import argparse

import pytest

from bench import child, configs


def env_of(name, environ=None, variants=None):
    return configs.child_environment(configs.resolve(name, variants or {}), environ or {})


def test_each_configuration_sets_only_its_own_allocator_settings():
    environ = {
        "PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6",
        "PYTORCH_ALLOC_CONF": "x",
        "PYTHONPATH": "/elsewhere",
        "KEEP": "1",
    }
    for name in ("native", "native-aa", "streampool"):
        env = env_of(name, environ)
        assert "PYTORCH_CUDA_ALLOC_CONF" not in env and "PYTORCH_ALLOC_CONF" not in env
        assert env["KEEP"] == "1" and env["HF_HUB_OFFLINE"] == "1"
        assert env["PYTHONPATH"].split(":") == [str(configs.REPO_ROOT), "/elsewhere"]
        assert "STREAMPOOL_BACKEND" not in env and "STREAMPOOL_CACHE_MAX_BLOCK" not in env
    assert env_of("expandable")["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert env_of("torch-async")["PYTORCH_CUDA_ALLOC_CONF"] == "backend:cudaMallocAsync"
    assert env_of("streampool-vmm")["STREAMPOOL_BACKEND"] == "vmm"
    assert env_of("streampool-nocache")["STREAMPOOL_CACHE_MAX_BLOCK"] == "0"


def test_the_aa_control_is_native_under_another_name():
    assert configs.CONFIGS["native-aa"] == configs.CONFIGS["native"]
    assert configs.CONFIG_NAMES[:2] == ("native", "native-aa")


def test_expected_backends():
    backends = {name: config.backend for name, config in configs.CONFIGS.items()}
    assert backends["native"] == backends["expandable"] == "native"
    assert backends["torch-async"] == "cudaMallocAsync"
    assert (
        backends["streampool"] == backends["streampool-vmm"] == backends["rmm-pool"] == "pluggable"
    )


def test_the_pool_alone_runs_only_churn_and_multistream():
    selected = ["empty_1KiB", "churn", "multistream", "gpt2"]
    assert configs.workloads_of(configs.CONFIGS["streampool-nocache"], selected) == [
        "churn",
        "multistream",
    ]
    assert configs.workloads_of(configs.CONFIGS["streampool"], selected) == selected
    assert configs.workloads_of(configs.CONFIGS["streampool-nocache"], ["gpt2"]) == []


def test_variants_are_streampool_with_their_settings():
    label, settings = configs.parse_variant("small:STREAMPOOL_SMALL_POOL_MAX=1MiB,STREAMPOOL_X=2")
    assert label == "small" and settings == {
        "STREAMPOOL_SMALL_POOL_MAX": "1MiB",
        "STREAMPOOL_X": "2",
    }
    env = env_of("streampool:small", variants={"small": settings})
    assert env["STREAMPOOL_SMALL_POOL_MAX"] == "1MiB" and env["STREAMPOOL_X"] == "2"
    assert configs.resolve("streampool:small", {"small": settings}).base == "streampool"


@pytest.mark.parametrize("text", ["small", "x:PATH=/", ":STREAMPOOL_X=1", "x:STREAMPOOL_X="])
def test_bad_variants_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        configs.parse_variant(text)


def test_cotenant_configurations_follow_the_main_ones():
    full = configs.cotenant_configs(
        [
            "native",
            "native-aa",
            "expandable",
            "torch-async",
            "streampool",
            "streampool-vmm",
            "rmm-pool",
        ],
        quick=False,
    )
    assert full == [
        "native",
        "native+empty_cache",
        "expandable",
        "torch-async",
        "streampool",
        "streampool-threshold-1GiB",
        "streampool-vmm",
    ]
    quick = configs.cotenant_configs(["native", "expandable", "streampool"], quick=True)
    assert quick == ["native", "streampool", "streampool-threshold-1GiB"]
    threshold = configs.COTENANT_CONFIGS["streampool-threshold-1GiB"]
    assert dict(threshold.config.env) == {"STREAMPOOL_RELEASE_THRESHOLD": "1GiB"}
    assert configs.COTENANT_CONFIGS["native+empty_cache"].empty_cache
    assert not any(
        c.empty_cache for n, c in configs.COTENANT_CONFIGS.items() if n != "native+empty_cache"
    )


def test_a_streampool_child_refuses_variables_its_library_does_not_read():
    known = ["STREAMPOOL_CACHE_MAX_BLOCK", "STREAMPOOL_LOG"]
    environ = {
        "STREAMPOOL_BACKEND": "vmm",
        "STREAMPOOL_LOG": "warn",
        "STREAMPOOL_LIBRARY": "/x.so",
        "STREAMPOOL_CACHE_MAX_BLOCK": "0",
        "OTHER": "1",
    }
    assert child.unknown_streampool_variables(environ, known) == ["STREAMPOOL_BACKEND"]
    with pytest.raises(RuntimeError, match="does not read STREAMPOOL_BACKEND"):
        child.check_streampool_variables({"STREAMPOOL_BACKEND_TYPO": "vmm"})
    child.check_streampool_variables({"STREAMPOOL_RELEASE_THRESHOLD": "1GiB"})  # a known one


def test_child_command_runs_the_child_module():
    command = child.command("streampool", "pluggable", ["empty_1KiB", "gpt2"])
    assert command[1:] == [
        "-m",
        "bench.child",
        "--base",
        "streampool",
        "--backend",
        "pluggable",
        "--workloads",
        "empty_1KiB,gpt2",
    ]
    options = child.parse_args(command[3:])
    assert options.base == "streampool" and options.workloads == ["empty_1KiB", "gpt2"]
    with pytest.raises(SystemExit):
        child.parse_args(["--base", "native", "--backend", "native", "--workloads", "cotenant"])
