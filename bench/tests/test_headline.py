"""The docs' benchmark tables: generated from the committed results of the newest full run, and
the test that fails when README.md or BENCHMARKS.md says anything else (headline.py)."""

import json
import re
import shutil

import pytest

from bench import headline

ROOT = headline.ROOT


def test_the_docs_tables_are_what_the_committed_results_generate():
    run = headline.load(ROOT)
    stale = headline.stale_blocks(ROOT, run)
    assert stale == [], f"{stale}: run python3 -m bench headline (the newest run is {run.folder})"


def copy_of_the_repository(tmp_path, folder=None):
    """README.md, BENCHMARKS.md, the package's defaults and one run's report (and parity table)
    under tmp_path."""
    run = headline.load(ROOT) if folder is None else headline.Run(ROOT, ROOT / folder)
    for name in ("README.md", "BENCHMARKS.md", "python/streampool/_config.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    target = tmp_path / run.folder
    target.mkdir(parents=True)
    for name in (headline.REPORT_FILE, headline.RUN_FILE, headline.PARITY_FILE):
        if (ROOT / run.folder / name).is_file():
            shutil.copy(ROOT / run.folder / name, target / name)
    for sub in (ROOT / run.folder).iterdir():  # the groups' folders, which the commands name
        if sub.is_dir():
            (target / sub.name).mkdir()
    for page in (ROOT / run.folder).glob("**/sleep/sleep.md"):  # which the sleep lines name
        copy = target / page.relative_to(ROOT / run.folder)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(page, copy)
    newest = headline.load(ROOT).parity  # the newest parity table may be a run's of its own
    if newest is not None:
        (tmp_path / newest[0]).mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / newest[0] / headline.PARITY_FILE, tmp_path / newest[0] / headline.PARITY_FILE)
    return run


def test_a_hand_edited_number_is_found_and_rewritten(tmp_path, capsys):
    run = copy_of_the_repository(tmp_path)
    readme = tmp_path / "README.md"
    churn = next(line for line in readme.read_text().splitlines() if line.startswith("| `churn` |"))
    last = list(re.finditer(r"\d\.\d\d", churn))[-1]  # the row's last figure, whatever the run
    edited = churn[:last.start()] + ("9.99" if last.group() != "9.99" else "8.88") + churn[last.end():]
    assert edited != churn, churn
    readme.write_text(readme.read_text().replace(churn, edited))
    assert headline.stale_blocks(tmp_path, headline.load(tmp_path)) == ["README.md: readme-table"]
    assert headline.main(["--check"], root=tmp_path) == 1
    assert f"README.md: readme-table differs from what {run.folder} generates" in capsys.readouterr().err
    assert headline.main([], root=tmp_path) == 0
    assert churn in readme.read_text() and headline.main(["--check"], root=tmp_path) == 0


def test_a_document_without_its_markers_is_an_error(tmp_path):
    copy_of_the_repository(tmp_path)
    text = (tmp_path / "BENCHMARKS.md").read_text().replace("<!-- /generated:noise -->", "")
    (tmp_path / "BENCHMARKS.md").write_text(text)
    with pytest.raises(SystemExit, match="BENCHMARKS.md: no <!-- generated:noise -->"):
        headline.main(["--check"], root=tmp_path)


# --- made-up runs -------------------------------------------------------------------------------


def time(ratio, low, high, n=24, log_sd=0.05):
    return {"ratio": ratio, "ci95": [low, high], "n": n, "log_sd": log_sd, "ref": "native"}


def memory(ratio):
    return {"ratio": ratio, "low": ratio, "high": ratio, "runs": 1}


def report(workloads, cotenant=None, device="NVIDIA H200"):
    return {
        "facts": {"device": [device], "driver": ["580.1"], "torch": ["2.12.0"],
                  "dates": ["2027-01-02 10:00 UTC", "2027-01-02 10:20 UTC"],
                  "commands": ["python3 -m bench --group models --out-dir /scratch/models"],
                  "merge_command": None},
        "workloads": workloads, "cotenant": cotenant or {}, "targets": [],
    }


def write_run(root, name, built, meta=None, parity=None):
    folder = root / "bench" / "results" / name
    folder.mkdir(parents=True)
    (folder / headline.REPORT_FILE).write_text(json.dumps(built))
    if meta is not False:
        (folder / headline.RUN_FILE).write_text(json.dumps(meta or {"commit": "abc1234", "default_backend": "pool"}))
    if parity is not None:
        (folder / headline.PARITY_FILE).write_text(parity)
    return folder


@pytest.fixture
def root(tmp_path):
    config = tmp_path / "python" / "streampool" / "_config.py"
    config.parent.mkdir(parents=True)
    config.write_text('VARIABLE_DEFAULTS = {"STREAMPOOL_BACKEND": "pool"}\n')
    return tmp_path


GPT2 = {
    "native": {"memory": memory(1.80)},
    "native-aa": {"time": time(1.00, 0.98, 1.03)},
    "expandable": {"memory": memory(1.07), "time": time(0.99, 0.97, 1.02)},
    "streampool": {"memory": memory(1.05), "time": time(1.10, 1.06, 1.14)},   # the pool backend
    "streampool-vmm": {"memory": memory(1.09), "time": time(0.95, 0.93, 0.96)},
}


def test_the_newest_run_with_a_run_json_is_the_headline(root):
    write_run(root, "2027-01-02", report({"gpt2": GPT2}))
    write_run(root, "2027-01-09", report({"gpt2": GPT2}, device="NVIDIA B200"))
    write_run(root, "2027-02-01-smoke", report({"gpt2": GPT2}), meta=False)  # not a full run
    run = headline.load(root)
    assert run.name == "2027-01-09"
    assert run.provenance() == ("Run `bench/results/2027-01-09/` of 2027-01-02: NVIDIA B200, driver 580.1, "
                                "torch 2.12.0; library of commit `abc1234`, whose default backend was `pool`.")


def test_a_run_json_without_commit_or_backend_is_refused(root):
    write_run(root, "2027-01-02", report({}), meta={"commit": "abc1234"})
    with pytest.raises(SystemExit, match="run.json must say"):
        headline.load(root)


def test_each_backend_comes_from_its_own_configuration_or_the_default_it_was(root):
    write_run(root, "2027-01-02", report({"gpt2": GPT2}))
    table = "\n".join(headline.readme_table(headline.load(root)))
    header = next(line for line in table.splitlines() if line.startswith("| workload"))
    assert header.endswith("| streampool `pool` (default) | streampool `vmm` |")
    assert "| `gpt2` | 1.00 (0.98–1.03) | 1.80 · 1 | 1.07 · 0.99 | 1.05 · 1.10 | 1.09 · 0.95 |" in table


def test_the_sleep_lines_name_the_sleep_md_the_run_committed(root):
    from bench.tests.test_sleep_report import fabricated_report
    folder = write_run(root, "2027-01-02", dict(report({"gpt2": GPT2}), sleep=fabricated_report()))
    page = folder / "sleep-group" / "sleep" / "sleep.md"
    page.parent.mkdir(parents=True)
    page.write_text("# Sleep and wake\n")
    table = "\n".join(headline.run_table(headline.load(root)))
    assert "Sleep and wake (`bench/results/2027-01-02/sleep-group/sleep/sleep.md`):" in table


def test_a_failed_configuration_reads_fails_and_a_missing_one_not_run(root):
    bert = {"native": {"memory": memory(1.4)}, "expandable": {"memory": memory(1.0), "time": time(1.1, 1.0, 1.2)},
            "streampool": {"failed": True, "errors": ["RuntimeError: CUDA error"]}}
    write_run(root, "2027-01-02", report({"gpt2": GPT2, "bert": bert}))
    run = headline.load(root)
    readme = "\n".join(headline.readme_table(run))
    assert "| `bert` | not run | 1.40 · 1 | 1.00 · 1.10 | fails | not run |" in readme
    assert "fails on `bert`" in readme
    full = "\n".join(headline.run_table(run))
    bert_row = next(line for line in full.splitlines() if line.startswith("| `bert`"))
    assert "| fails |" in bert_row and "| not run |" in bert_row and "**failed**" not in bert_row


def test_wins_and_losses_against_expandable_need_intervals_apart(root):
    write_run(root, "2027-01-02", report({"gpt2": GPT2}))
    run = headline.load(root)
    assert headline.versus_expandable(run, "pool") == {
        "less": ["`gpt2`"], "more": [], "faster": [], "slower": ["`gpt2`"], "fails": []}
    assert headline.versus_expandable(run, "vmm") == {
        "less": [], "more": ["`gpt2`"], "faster": ["`gpt2`"], "slower": [], "fails": []}
    overlapping = dict(GPT2, streampool={"memory": memory(1.07), "time": time(1.05, 1.01, 1.09)})
    write_run(root, "2027-01-03", report({"gpt2": overlapping}))
    same = headline.versus_expandable(headline.load(root), "pool")
    assert same == {"less": [], "more": [], "faster": [], "slower": [], "fails": []}


def test_the_idle_row_and_line_use_the_co_tenant(root):
    cotenant = {"native": {"probes": [{"idle_s": 3.0, "held_gib_median": 12.9}]},
                "expandable": {"probes": [{"idle_s": 0.5, "held_gib_median": 12.5},
                                          {"idle_s": 3.0, "held_gib_median": 12.2}]},
                "streampool": {"probes": [{"idle_s": 3.0, "held_gib_median": 0.41}]},
                "streampool-vmm": {"error": "exited with status 1"}}
    write_run(root, "2027-01-02", report({"gpt2": GPT2}, cotenant=cotenant))
    table = "\n".join(headline.readme_table(headline.load(root)))
    assert "3 s after GPT-2 training stops | | 12.90 | 12.20 | 0.41 | fails |" in table
    assert "held 0.41 GiB beyond live tensors 3 s after training stopped, against 12.20 GiB" in table


def test_the_parity_table_comes_from_the_newest_folder_that_has_one(root):
    write_run(root, "2027-01-02", report({"gpt2": GPT2}), parity="| feature | kept |\n|---|---|\n| a | yes |\n")
    write_run(root, "2027-01-05", report({"gpt2": GPT2}), meta=False, parity="| feature | kept |\n|---|---|\n| b | no |\n")
    write_run(root, "2027-01-09", report({"gpt2": GPT2}))
    lines = headline.parity_block(headline.load(root))
    assert lines[0] == "From `bench/results/2027-01-05/parity.md`:" and lines[-1].endswith("| b | no |")
    assert headline.parity_block(headline.load(root, root / "bench/results/2027-01-02")) != []


def test_no_parity_table_leaves_its_slot_empty(root):
    write_run(root, "2027-01-02", report({"gpt2": GPT2}))
    assert headline.parity_block(headline.load(root)) == []
    text = "a\n<!-- generated:parity x -->\nold\n<!-- /generated:parity -->\nb\n"
    assert headline.apply(text, ["parity"], {"parity": ""}, "X.md") == (
        "a\n<!-- generated:parity x -->\n<!-- /generated:parity -->\nb\n")


def test_the_noise_table_gives_the_pairs_a_precision_needs(root):
    write_run(root, "2027-01-02", report({"gpt2": GPT2}))
    noise = headline.noise_table(headline.load(root))
    # (1.96 · sqrt(pi / 2) · 0.05 / ln 1.03)^2 = 17.3 pairs for ±3%; at least 10 for ±5% (6.3)
    assert noise[-1] == "| `gpt2` | 1.00 (0.98–1.03) | 5.0% | 24 | 18 | 10 |"


def test_commands_point_to_where_the_results_are_committed(root):
    folder = write_run(root, "2027-01-02", report({"gpt2": GPT2}))
    run = headline.load(root)
    assert headline.command_text(run, "python3 -m bench --out-dir /scratch/models") == \
        "python3 -m bench --out-dir DIR"
    (folder / "models").mkdir()
    assert headline.command_text(run, "python3 -m bench --out-dir /scratch/models") == \
        "python3 -m bench --out-dir bench/results/2027-01-02/models"


def test_committed_reports_name_no_folder_of_the_machine_that_ran_them():
    # Reports said `--out-dir /root/out/bench-alloc`; the writer now makes paths relative
    # (bench/portable.py) and the committed ones were rewritten to where their results are.
    reports = [p for p in (ROOT / headline.RESULTS).rglob("*")
               if p.name in ("report.md", "report.json", "latest.md")]
    assert reports
    absolute = re.compile(r"(?<![\w.])/(root|home|work|tmp)/")
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in reports
             for m in [absolute.search(p.read_text())] if m]
    assert found == []


def test_the_readme_summary_gives_each_backend_s_memory_against_expandable_segments(root):
    write_run(root, "2027-01-02", report({"gpt2": GPT2}))
    lines = headline.readme_summary(headline.load(root))
    assert lines[0].startswith("Against expandable segments")
    assert "(`bench/results/2027-01-02/`, NVIDIA H200, commit `abc1234`)" in lines[0]
    assert lines[1:] == [
        "- `pool` (default): less memory on `gpt2` 1.07 → 1.05; time: slower on `gpt2` (95% "
        "intervals apart), the rest within the noise.",
        "- `vmm`: more memory on `gpt2` 1.07 → 1.09; time: faster on `gpt2` (95% intervals apart), "
        "the rest within the noise.",
    ]


def test_a_memory_difference_that_two_decimals_hide_is_told_in_mib(root):
    # vision_sizes of the 2026-12-01 run: 2,752 MiB against expandable's 2,750, both 1.04.
    live = 2_776_613_376

    def held(mib):
        return {**memory(mib * 2**20 / live), "peak_device_bytes": mib * 2**20}

    cells = dict(GPT2, expandable={"memory": held(2750), "time": time(0.99, 0.97, 1.02)},
                 streampool={"memory": held(2750.4), "time": time(1.00, 0.97, 1.03)},
                 **{"streampool-vmm": {"memory": held(2752), "time": time(1.00, 0.97, 1.03)}})
    write_run(root, "2027-01-02", report({"vision_sizes": cells}))
    run = headline.load(root)
    assert headline.versus_expandable(run, "vmm")["more"] == ["`vision_sizes`"]
    assert headline.memory_against_expandable(run, "vmm") == {
        "less": [], "more": ["`vision_sizes` 1.04 → 1.04 (+2 MiB)"]}
    assert headline.memory_against_expandable(run, "pool") == {"less": [], "more": []}
    # Medians over process sets: the ratio may point the other way from the peak; the MiB say.
    cells["streampool-vmm"]["memory"] = {**held(2752), "ratio": 1.03}
    write_run(root, "2027-01-03", report({"vision_sizes": cells}))
    assert headline.memory_against_expandable(headline.load(root), "vmm") == {
        "less": [], "more": ["`vision_sizes` 1.04 → 1.03 (+2 MiB)"]}
    # Without peaks, the ratios to two decimals.
    bare = dict(GPT2, expandable={"memory": memory(1.0399)},
                **{"streampool-vmm": {"memory": memory(1.0401)}})
    write_run(root, "2027-01-04", report({"vision_sizes": bare}))
    assert headline.memory_against_expandable(headline.load(root), "vmm") == {"less": [], "more": []}


def test_the_readme_summary_puts_the_library_s_default_backend_first(root):
    write_run(root, "2027-01-02", report({"gpt2": GPT2}))
    (root / "python/streampool/_config.py").write_text('VARIABLE_DEFAULTS = {"STREAMPOOL_BACKEND": "vmm"}\n')
    lines = headline.readme_summary(headline.load(root))
    assert [line.split(":")[0] for line in lines[1:]] == ["- `vmm` (default)", "- `pool`"]


def test_the_readme_summary_says_same_and_fails_instead_of_leaving_a_backend_blank(root):
    same = dict(GPT2, streampool={"memory": memory(1.07), "time": time(1.00, 0.97, 1.03)},
                **{"streampool-vmm": {"failed": True, "errors": ["RuntimeError: CUDA error"]}})
    write_run(root, "2027-01-02", report({"gpt2": same}))
    assert headline.readme_summary(headline.load(root))[1:] == [
        "- `pool` (default): the same memory; time: within the noise on every workload.",
        "- `vmm`: the same memory; time: within the noise on every workload; fails on `gpt2`."]


def test_the_readme_summary_leads_with_the_idle_memory_where_the_run_has_a_co_tenant(root):
    cotenant = {"native": {"probes": [{"idle_s": 3.0, "held_gib_median": 12.87}]},
                "expandable": {"probes": [{"idle_s": 3.0, "held_gib_median": 12.2}]},
                "streampool": {"probes": [{"idle_s": 3.0, "held_gib_median": 0.56}]},
                "streampool-vmm": {"error": "exited with status 1"}}
    write_run(root, "2027-01-02", report({"gpt2": GPT2}, cotenant=cotenant))
    lines = headline.readme_summary(headline.load(root))
    assert lines[1] == ("- GiB held beyond live tensors 3 s after GPT-2 training stops (memory the "
                        "card's other processes cannot have): native 12.87, expandable segments 12.20, "
                        "`pool` (default) 0.56, `vmm` fails.")
    write_run(root, "2027-01-03", report({"gpt2": GPT2}))  # no co-tenant group: no idle line
    assert not any("GiB held" in line for line in headline.readme_summary(headline.load(root)))


def test_the_readme_s_first_screen_makes_the_case_in_40_lines_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    first = text[:text.index("\n## ")].splitlines()
    assert len(first) <= 40, f"{len(first)} lines before the first section"
    screen = "\n".join(first)
    for needed in ("streampool.install()", "empty_cache()", "streampool.cupy.install()",
                   "streampool compare", "<!-- generated:readme-summary", "Which backend",
                   "scripts/demo", "scripts/test"):
        assert needed in screen, needed
    assert "until the process exits" not in text  # untrue: PyTorch has empty_cache()


def test_the_readme_has_no_placeholder_left():
    import re

    text = (ROOT / "README.md").read_text()
    assert re.findall(r"\{[A-Z][A-Z_]+\}", text) == []
