"""Configurations: what each worker's environment holds, what each is paired with, variants,
the co-tenant's configurations of A, and the refusal of STREAMPOOL_* variables the library does
not read."""

import argparse

import pytest

from bench import configs
from bench.engine import unknown_streampool_variables


def env_of(name, environ=None, variants=None):
    return configs.worker_environment(configs.resolve(name, variants or {}), environ or {})


def test_each_configuration_sets_only_its_own_allocator_settings():
    environ = {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6",
               "PYTORCH_ALLOC_CONF": "x", "PYTHONPATH": "/elsewhere", "KEEP": "1"}
    for name in ("native", "native-aa", "streampool"):
        env = env_of(name, environ)
        assert "PYTORCH_CUDA_ALLOC_CONF" not in env and "PYTORCH_ALLOC_CONF" not in env
        assert env["KEEP"] == "1" and env["HF_HUB_OFFLINE"] == "1"
        assert env["PYTHONPATH"].split(":") == [str(configs.REPO_ROOT), "/elsewhere"]
        assert "STREAMPOOL_BACKEND" not in env  # the default is whatever the library's is
    assert env_of("expandable")["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert env_of("torch-async")["PYTORCH_CUDA_ALLOC_CONF"] == "backend:cudaMallocAsync"
    assert env_of("streampool-pool")["STREAMPOOL_BACKEND"] == "pool"
    assert env_of("streampool-vmm")["STREAMPOOL_BACKEND"] == "vmm"
    threshold = env_of("streampool-threshold-1GiB")
    assert threshold["STREAMPOOL_RELEASE_THRESHOLD"] == "1GiB"


def test_every_configuration_is_paired_with_native_but_the_threshold():
    assert configs.CONFIGS["native-aa"][:4] == configs.CONFIGS["native"][:4]
    pairs = configs.pairs_of(list(configs.DEFAULT_CONFIGS), {})
    assert pairs == [("native", c) for c in configs.DEFAULT_CONFIGS[1:]]
    assert configs.pairs_of(list(configs.PRICE_CONFIGS), {})[2:] == [
        ("streampool", "streampool-threshold-1GiB"), ("native", "streampool-pool"),
        ("streampool-pool", "streampool-pool-threshold-1GiB")]
    assert dict(configs.CONFIGS["streampool-vmm-threshold-1GiB"].env) == {
        "STREAMPOOL_BACKEND": "vmm", "STREAMPOOL_RELEASE_THRESHOLD": "1GiB"}
    assert dict(configs.CONFIGS["streampool-pool-threshold-1GiB"].env) == {
        "STREAMPOOL_BACKEND": "pool", "STREAMPOOL_RELEASE_THRESHOLD": "1GiB"}
    assert configs.CONFIGS["streampool-pool-threshold-1GiB"].reference == "streampool-pool"
    with pytest.raises(ValueError, match="select it too"):
        configs.pairs_of(["native", "streampool-threshold-1GiB"], {})


def test_default_configurations_are_the_issue_list_rmm_optional():
    assert configs.DEFAULT_CONFIGS == ("native", "native-aa", "expandable", "torch-async",
                                       "streampool", "streampool-pool")
    assert {"rmm-pool", "rmm-async"} <= set(configs.CONFIG_NAMES)


def test_variants_are_streampool_with_their_settings():
    label, settings = configs.parse_variant("small:STREAMPOOL_SMALL_POOL_MAX=1MiB,STREAMPOOL_X=2")
    assert label == "small" and settings == {"STREAMPOOL_SMALL_POOL_MAX": "1MiB",
                                             "STREAMPOOL_X": "2"}
    env = env_of("streampool:small", variants={"small": settings})
    assert env["STREAMPOOL_SMALL_POOL_MAX"] == "1MiB" and env["STREAMPOOL_X"] == "2"
    assert configs.resolve("streampool:small", {"small": settings}).reference == "native"


@pytest.mark.parametrize("text", ["small", "x:PATH=/", ":STREAMPOOL_X=1", "x:STREAMPOOL_X="])
def test_bad_variants_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="--variant"):
        configs.parse_variant(text)


def test_the_cotenant_configurations_of_a():
    assert configs.COTENANT_NAMES == ("native", "native+empty_cache", "expandable", "torch-async",
                                      "streampool", "streampool-threshold-1GiB", "streampool-pool",
                                      "streampool-pool-threshold-1GiB")
    assert configs.COTENANT_CONFIGS["native+empty_cache"].empty_cache
    assert not configs.COTENANT_CONFIGS["native"].empty_cache


def test_unknown_streampool_variables_are_found():
    environ = {"STREAMPOOL_BACKEND": "vmm", "STREAMPOOL_LIBRARY": "/x.so",
               "STREAMPOOL_RELEAS_THRESHOLD": "1GiB", "OTHER": "1"}
    known = ["STREAMPOOL_BACKEND", "STREAMPOOL_RELEASE_THRESHOLD"]
    assert unknown_streampool_variables(environ, known) == ["STREAMPOOL_RELEAS_THRESHOLD"]
