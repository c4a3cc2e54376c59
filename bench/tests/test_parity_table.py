"""The parity table from GPU outcomes: every feature a row, failures say so, missing runs too."""

import json

from bench import parity_table


def _line(case, backend, streampool=True, agree=True, pluggable=None, error=None):
    line = {"case": case, "backend": backend, "native": True, "streampool": streampool, "agree": agree,
            "torch": "2.11.0", "device": "NVIDIA H100"}
    if pluggable is not None:
        line.update(pluggable=pluggable, pluggable_error=error)
    return line


def test_rows_show_each_column_and_failures():
    lines = [
        _line("cudnn_benchmark", "pool", pluggable=False, error="RuntimeError: does not yet support cacheInfo"),
        _line("cudnn_benchmark", "vmm"),
        _line("mempool", "pool", agree=False, pluggable=False),
    ]
    text = parity_table.table(lines, "abc1234")
    rows = {r.split(" | ")[0]: r for r in text.splitlines() if r.startswith("| ")}
    cudnn = rows["| `torch.backends.cudnn.benchmark = True`, conv training"]
    assert cudnn.endswith("| ✓ | fails: RuntimeError: does not yet support cacheInfo | ✓ | ✓ |")
    mempool = rows["| `torch.cuda.MemPool` + `use_mem_pool` (and `use_on_oom`, `no_split`)"]
    # The plain pluggable allocator ran (no error) and gave another result.
    assert mempool.endswith("| ✓ | differs from native | fails | not run |"), mempool
    assert "| not run | not run | not run | not run |" in rows["| `get_per_process_memory_fraction`"]
    assert "commit abc1234" in text and "NVIDIA H100" in text


def test_main_writes_parity_md(tmp_path):
    (tmp_path / "parity-pool.jsonl").write_text(json.dumps(_line("mempool", "pool", pluggable=False)) + "\n")
    assert parity_table.main([str(tmp_path)]) == 0
    assert "MemPool" in (tmp_path / "parity.md").read_text()
    assert parity_table.main([str(tmp_path / "empty")]) == 1


def test_the_table_names_the_measured_commit_and_later_lines_replace_earlier(tmp_path):
    lines = [_line("mempool", "pool", streampool=False, agree=False), _line("mempool", "pool")]
    (tmp_path / "parity-pool.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
    (tmp_path / "run.json").write_text(json.dumps({"commit": "feed123", "default_backend": "pool"}))
    assert parity_table.main([str(tmp_path)]) == 0
    text = (tmp_path / "parity.md").read_text()
    assert "commit feed123" in text
    row = next(r for r in text.splitlines() if "MemPool" in r)
    assert row.endswith("| ✓ | not run | ✓ | not run |"), row


def test_a_documented_difference_shows_as_such_and_new_rows_are_not_run_until_measured():
    refused = dict(_line("multiprocessing_queue", "pool", agree=False),
                   difference="raises at `put`: InvalidArgumentError: not in a shareable pool")
    lines = [refused, _line("multiprocessing_queue", "vmm")]
    text = parity_table.table(lines, "abc1234")
    row = next(r for r in text.splitlines() if "torch.multiprocessing" in r)
    assert row.endswith("| ✓ | not run | differs: raises at `put`: InvalidArgumentError: not in a shareable pool | ✓ |"), row
    unmeasured = next(r for r in text.splitlines() if "add up to" in r)
    assert unmeasured.endswith("| not run | not run | not run | not run |"), unmeasured
    # A failure is a failure even where a difference is documented for the case.
    failed = dict(refused, streampool=False)
    row = next(r for r in parity_table.table([failed], "x").splitlines() if "torch.multiprocessing" in r)
    assert "| fails |" in row, row


def test_a_long_difference_is_cut_at_a_space_outside_code():
    long = ("raises at `put`: InvalidArgumentError: 0x302000000 on device 0 is not in a shareable "
            "pool: allocate it inside `with streampool.shareable():`, or install with ipc")
    cell = parity_table._streampool_cell(dict(_line("multiprocessing_queue", "pool", agree=False),
                                              difference=long))
    assert cell == ("differs: raises at `put`: InvalidArgumentError: 0x302000000 on device 0 is "
                    "not in a shareable pool: allocate it inside …"), cell
    assert parity_table._short("short `x`") == "short `x`"


def test_the_plain_pluggable_allocator_differs_only_where_native_passed():
    ran = dict(_line("mempool", "pool", pluggable=False), native=False)
    row = next(r for r in parity_table.table([ran], "x").splitlines() if "MemPool" in r)
    assert row.endswith("| fails | fails | ✓ | not run |"), row
