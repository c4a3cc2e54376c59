"""PyTorch's allocator settings under install(): each key of PyTorch's caching allocator that
streampool cannot honour gets one warning naming it and what to do instead (streampool._alloc_conf;
the GPU case alloc_conf_environment runs it under install())."""

import logging

import pytest

from streampool import _alloc_conf


@pytest.fixture(autouse=True)
def fresh():
    _alloc_conf.forget_warnings()
    yield
    _alloc_conf.forget_warnings()


def test_settings_are_split_as_pytorch_writes_them():
    text = "expandable_segments:True, roundup_power2_divisions:[256:1,512:2,>:8],pinned_use_cuda_host_register:True"
    keys = [k for k, _, _ in _alloc_conf.unhonoured(text)]
    assert keys == ["expandable_segments", "roundup_power2_divisions"], "pinned_* keys still work"
    value = dict((k, v) for k, v, _ in _alloc_conf.unhonoured(text))["roundup_power2_divisions"]
    assert value == "[256:1,512:2,>:8]"


def test_each_unhonoured_key_of_the_environment_is_warned_about_once(caplog):
    environ = {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:128",
        "PYTORCH_ALLOC_CONF": "expandable_segments:True,garbage_collection_threshold:0.6,no_such_key:1",
    }
    with caplog.at_level(logging.WARNING, logger="streampool"):
        warned = _alloc_conf.warn_environment(environ)
        again = _alloc_conf.warn_environment(environ)
    assert warned == ["expandable_segments", "garbage_collection_threshold", "no_such_key", "max_split_size_mb"]
    assert again == [], "once per process"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4
    expandable = next(line for line in lines if "expandable_segments" in line)
    assert "PYTORCH_ALLOC_CONF" in expandable and "STREAMPOOL_BACKEND=vmm" in expandable, expandable
    assert any("max_split_size_mb" in line and "PYTORCH_CUDA_ALLOC_CONF" in line for line in lines)
    assert any("no_such_key" in line and "not a key" in line for line in lines)
    assert _alloc_conf.warn_environment({}) == []


def test_set_allocator_settings_keeps_pytorchs_parsing_and_warns(caplog):
    seen = []

    def pytorch(settings):
        if "bad" in settings:
            raise RuntimeError("Unrecognized key")  # PyTorch refuses malformed settings itself
        seen.append(settings)

    route = _alloc_conf.set_allocator_settings(pytorch)
    with caplog.at_level(logging.WARNING, logger="streampool"):
        route("expandable_segments:True,pinned_num_register_threads:4")
        with pytest.raises(RuntimeError, match="Unrecognized"):
            route("bad:1")
    assert seen == ["expandable_segments:True,pinned_num_register_threads:4"], "PyTorch's own call ran"
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "_set_allocator_settings sets expandable_segments:True" in messages[0], messages
