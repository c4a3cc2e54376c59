"""``python3 -m bench``: the run, the calibration and the merge, and the files they write.

- ``python3 -m bench [--group G ...] [--out-dir DIR]``: the workloads of each group
  (plan.GROUPS; ``cotenant``: the co-tenant and the price of a release threshold; ``sleep``:
  sleep and wake against torch_memory_saver, bench/sleep.py, into DIR/sleep), every
  configuration in long-lived workers, in several process sets one after the other (sets.py);
  each workload's block length, pairs and process sets from the calibration file
  (plan.CALIBRATION_PATH, else plan's defaults; ``--block-s``, ``--pairs``, ``--processes``
  override); ``--without pin,...`` turns settings of isolation.py off. DIR/results.json (the raw
  results, rewritten after every workload), DIR/report.json and DIR/report.md. Without --group:
  every group, one after the other.
- ``python3 -m bench calibrate [--group G]``: the A/A in several process sets at several block
  lengths; DIR/calibration.json (raw) and DIR/calibration.md, and the chosen settings into the
  calibration file (calibrate.py).
- ``python3 -m bench merge DIR... --out-dir OUT``: the runs' results pooled into one report.
- ``python3 -m bench noise DIR...``: where the A/A difference comes from (noise.py), from a run's
  results.json or a calibration's calibration.json; ``python3 -m bench headline``: the tables of
  README.md and BENCHMARKS.md from the committed results (headline.py).
A command recorded in results.json and the reports names its paths relative (portable.py).
Invariant: the parent never imports torch or touches CUDA (workers do); it writes only into
--out-dir (calibrate: and its --write file); it does every pair it announces (no time budget cuts
a run short: --budget-s refuses up front a run estimated to need longer); without torch, numpy or
a GPU it says which in one line and exits with status 2.
"""

import datetime
import gzip
import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from . import (calibrate, cotenant, details, isolation, markdown, noise, nvml, plan, portable,
               protocol, report, runner, sets, sleep)
from .configs import COTENANT_NAMES, PRICE_CONFIGS, pairs_of
from .arguments import COMMAND, parse_args

RESULTS = "results.json"


def missing_requirement(python: str = sys.executable) -> Optional[str]:
    """What this machine lacks to run the benchmark, in one line (None: nothing)."""
    for module, why in (("torch", "PyTorch"), ("numpy", "numpy (the statistics)")):
        if importlib.util.find_spec(module) is None:
            return f"{COMMAND}: {why} is not installed here (no module {module}); nothing measured"
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)"
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    if done.returncode != 0:
        detail = protocol.tail(done.stderr, 1) if done.returncode != 3 else ""
        return (f"{COMMAND}: no CUDA GPU is visible to torch here "
                f"(torch.cuda.is_available() is False{'; ' + detail if detail else ''}); "
                "nothing measured")
    return None


def command_line(argv: Sequence[str], environ: Dict[str, str]) -> str:
    """The command as typed, with the STREAMPOOL_* variables that shape the allocator."""
    variables = [f"{k}={shlex.quote(v)}" for k, v in sorted(environ.items())
                 if k.startswith("STREAMPOOL_") and k != "STREAMPOOL_LIBRARY"]
    return " ".join(variables + [COMMAND] + [shlex.quote(a) for a in argv])


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def write_report(
    calls: List[Dict[str, Any]], out_dir: Path, merge_command: Optional[str] = None
) -> Dict[str, Any]:
    built = report.build(calls, merge_command=merge_command)
    _write(out_dir / "report.json", json.dumps(built, indent=1, allow_nan=False) + "\n")
    _write(out_dir / "report.md", details.render(built))
    protocol.progress(f"wrote {out_dir / 'report.md'} and report.json")
    return built


def _groups(options) -> List[tuple]:
    if options.workloads:
        return [("workloads", options.workloads)]
    return [(g, plan.GROUPS.get(g, ())) for g in options.groups]


def _calibration(options) -> Optional[Dict[str, Any]]:
    if str(options.calibration).lower() == "none":
        return None
    return plan.load_calibration(Path(options.calibration))


def _settings(options, workloads: Sequence[str], calibration) -> Dict[str, plan.Setting]:
    return plan.settings_for(workloads, calibration, options.block_s, options.pairs,
                             options.processes)


def announce(options, calibration) -> float:
    """Print what the run will do and return its estimated seconds."""
    total_s = 0.0
    others = len(options.configs) - 1
    for group, workloads in _groups(options):
        start_s = plan.start_s(group, calibration)
        if group == plan.SLEEP_GROUP:
            settings = {}
            seconds = len(plan.SLEEP_CONFIGS) * plan.SLEEP_CONFIG_S
            text = f"sleep and wake of GPT-2's training state: {', '.join(plan.SLEEP_CONFIGS)}"
        elif group == plan.COTENANT_GROUP:
            settings = _settings(options, ["gpt2"], calibration)
            seconds = len(COTENANT_NAMES) * options.cotenant_repeats * 20
            text = (f"co-tenant ({len(COTENANT_NAMES)} configurations of A × "
                    f"{options.cotenant_repeats})")
            if options.cotenant_without_price:
                settings = {}
            else:
                seconds += plan.estimate_s(["gpt2"], len(PRICE_CONFIGS), settings,
                                           plan.start_s("models", calibration), calibration)
                text += " and the price of a release threshold on gpt2"
        else:
            settings = _settings(options, workloads, calibration)
            seconds = plan.estimate_s(workloads, len(options.configs), settings, start_s,
                                      calibration)
            text = (f"{len(workloads)} workload(s) × {len(options.configs)} configurations "
                    f"({others} paired with their reference)")
        protocol.progress(f"{group}: {text}: about {seconds / 60:.1f} min")
        for workload, setting in settings.items():
            protocol.progress(f"  {workload}: {setting.processes} process sets × "
                              f"{setting.pairs} pairs of {setting.block_s:g} s blocks "
                              f"({setting.source})")
        total_s += seconds
    off = f"; without {', '.join(options.without)}" if options.without else ""
    protocol.progress(f"about {total_s / 60:.1f} min in all{off}")
    return total_s


def run(options, argv: Sequence[str], environ: Dict[str, str]) -> Dict[str, Any]:
    """The run (module docstring); returns its report."""
    release_s = plan.idle_release_s(environ)
    calibration = _calibration(options)
    library = nvml.Nvml.open()
    device = library.handle() if library else None
    call: Dict[str, Any] = {"facts": {
        "command": portable.relative_paths(command_line(argv, environ), Path.cwd()),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "driver": library.driver_version() if library else None,
        "block_s": options.block_s, "pairs": options.pairs, "idle_release_s": release_s,
        "configs": options.configs, "variants": options.variants, "groups": options.groups,
        "nvml": "clocks and power" if device is not None else None,
        "without": options.without, "settings": {},
        "calibration": (calibration or {}).get("facts"),
    }, "workers": {}, "workloads": [], "cotenant": [], "process_sets": []}
    sampler = runner.Sampler(library, device)

    def save(_: Any = None) -> None:
        _write(options.out_dir / RESULTS,
               json.dumps({"format": report.FORMAT, "runs": [call]}, allow_nan=False) + "\n")

    def run_sets(names: Sequence[str], workloads: Sequence[str]) -> None:
        settings = _settings(options, workloads, calibration)
        call["facts"]["settings"].update({w: s._asdict() for w, s in settings.items()})
        count = max(s.processes for s in settings.values())

        def todo(index: int) -> List[str]:
            return [w for w in workloads if settings[w].processes > index]

        base = runner.Options(plan.DEFAULT_PAIRS, plan.DEFAULT_BLOCK_S, release_s)
        for index, live, facts in sets.process_sets(
                count, names, options.variants, environ, base, todo, sampler, options.engine,
                options.without, library=library):
            call["process_sets"].append({**facts, "workloads": todo(index)})
            if not call["workers"]:
                call["workers"].update(facts["workers"])
            if any(i.get("baseline_process_bytes") is not None for i in live.infos.values()):
                call["facts"]["nvml"] = "clocks, power and process memory"
            per_workload = {w: runner.Options(settings[w].pairs, settings[w].block_s, release_s,
                                              "settle" not in facts["off"]) for w in todo(index)}

            def keep(record: Dict[str, Any], index: int = index) -> None:
                call["workloads"].append({**record, "process_set": index})
                save()

            runner.run_group(live, todo(index), pairs_of(names, options.variants), keep,
                             options=per_workload)

    for group, workloads in _groups(options):
        protocol.progress(f"=== {group}")
        if group == plan.SLEEP_GROUP:
            slept = sleep.run_configs(plan.SLEEP_CONFIGS, options.out_dir / "sleep", environ,
                                      sleep.CHILD_TIMEOUT_S, call["facts"]["command"])
            call["sleep"] = {k: v for k, v in slept.items() if k != "records"}
            save()
            continue
        if group != plan.COTENANT_GROUP:
            run_sets(options.configs, workloads)
            continue
        call["cotenant"] = cotenant.run_cotenant(COTENANT_NAMES, environ,
                                                 options.cotenant_repeats)
        save()
        if not options.cotenant_without_price:
            run_sets(list(PRICE_CONFIGS), ["gpt2"])
    save()
    return write_report([call], options.out_dir)


def run_calibration(options, argv: Sequence[str], environ: Dict[str, str]) -> None:
    """The calibration (calibrate.py) of each group in turn; the settings it chooses go into
    --write."""
    library = nvml.Nvml.open()
    sampler = runner.Sampler(library, library.handle() if library else None)
    facts = {
        "command": portable.relative_paths(command_line(argv, environ), Path.cwd()),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "blocks_s": options.blocks_s, "pairs": options.pairs, "processes": options.processes,
        "without": options.without, "ablate": options.ablate,
        "plan_configs": options.plan_configs, "call_s": options.call_s,
    }
    document: Dict[str, Any] = {"facts": facts, "groups": {}}
    for group, workloads in _groups(options):
        protocol.progress(f"=== calibration: {group}")
        raw = calibrate.run(workloads, options, environ, sampler, library,
                            plan.idle_release_s(environ))
        document["groups"][group] = raw
        facts.setdefault("device", raw.get("device"))
        _write(options.out_dir / "calibration.json", json.dumps(document, allow_nan=False))
        chosen = calibrate.choose(raw, group, options.plan_configs, options.call_s)
        raw["chosen"] = chosen
        if not options.ablate:
            calibrate.update_file(options.write, chosen, group, facts)
            protocol.progress(f"wrote the settings of group {group} into {options.write}")
    _write(options.out_dir / "calibration.json", json.dumps(document, allow_nan=False))
    text = calibrate.markdown(document)
    _write(options.out_dir / "calibration.md", text)
    print(text, flush=True)


def stored(path: Path) -> Path:
    """``path`` as written, or, where only that is there, as committed: gzip-compressed beside
    it as ``path``.gz (the raw per-block figures are most of a run's bytes). Where both are, the
    file as written: a merge into a committed folder writes it anew."""
    packed = path.with_name(path.name + ".gz")
    return packed if not path.exists() and packed.is_file() else path


def raw_results(directory: Path) -> Path:
    """A run's raw results in ``directory``: its results.json, or results.json.gz (stored)."""
    return stored(directory / RESULTS)


def read_json(path: Path) -> Any:
    """The JSON document at ``path``, gzip-compressed if its name ends in .gz."""
    if path.suffix == ".gz":
        return json.loads(gzip.decompress(path.read_bytes()))
    return json.loads(path.read_text())


def merge(dirs: Sequence[Path], out_dir: Path, command: Optional[str] = None) -> Dict[str, Any]:
    calls = []
    for directory in dirs:
        path = stored(directory) if directory.suffix in (".json", ".gz") else raw_results(directory)
        if not path.is_file():
            raise SystemExit(f"{COMMAND} merge: {path} not found (a run's --out-dir holds it)")
        found = read_json(path)["runs"]
        for call in found:  # each command names where its results are (located)
            facts = call.setdefault("facts", {})
            if facts.get("command"):
                facts["command"] = portable.located(facts["command"], path.parent, Path.cwd(),
                                                    RESULTS)
        calls += found
    _write(out_dir / RESULTS, json.dumps({"format": report.FORMAT, "runs": calls}) + "\n")
    return write_report(calls, out_dir, command)


def noise_report(paths: Sequence[Path]) -> str:
    """``python3 -m bench noise``: the A/A diagnosis (noise.py) of runs and calibrations."""
    lines: List[str] = []
    for given in paths:
        path = stored(given)
        if path.is_dir():
            found = [p for p in (raw_results(path), path / "calibration.json") if p.is_file()]
            if not found:
                raise SystemExit(f"{COMMAND} noise: {path} holds neither {RESULTS} nor "
                                 "calibration.json")
            path = found[0]
        if not path.is_file():
            raise SystemExit(f"{COMMAND} noise: {path} not found")
        document = read_json(path)
        if "runs" in document:
            parts = [("", noise.diagnose_calls(document["runs"]))]
        else:
            parts = [(f" (calibration, group {group})",
                      noise.diagnose(noise.sets_of_calibration(raw)))
                     for group, raw in document.get("groups", {}).items()]
        for what, diagnoses in parts:
            lines += [f"## {path}{what}", ""]
            lines += noise.markdown(diagnoses) or [
                "No A/A pair here carries the per-block records (GPU time, CPU time, CPUs): "
                "results from before they were recorded."]
            lines.append("")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None, environ: Optional[Dict[str, str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["headline"]:  # the docs' tables from committed results (headline.py)
        from . import headline

        return headline.main(argv[1:])
    environ = dict(os.environ if environ is None else environ)
    options = parse_args(argv)
    if options.mode == "noise":
        print(noise_report(options.dirs), flush=True)
        return 0
    if options.mode == "merge":
        built = merge(options.dirs, options.out_dir,
                      portable.relative_paths(command_line(argv, {}), Path.cwd()))
        print("\n".join(screen(built)), flush=True)
        return 0
    try:
        plan.idle_release_s(environ)
    except ValueError as exc:
        print(f"{COMMAND}: {exc}", file=sys.stderr)
        return 2
    if options.engine is None:
        missing = missing_requirement()
        if missing:
            print(missing, file=sys.stderr)
            return 2
    if options.mode == "calibrate":
        options.pairs = options.pairs or calibrate.DEFAULT_PAIRS
        options.processes = options.processes or calibrate.DEFAULT_PROCESSES
        estimate = sum(calibrate.estimate_s(workloads, options.blocks_s, options.pairs,
                                            options.processes, plan.start_s(group))
                       for group, workloads in _groups(options))
        protocol.progress(f"calibration: about {estimate / 60:.1f} min")
    else:
        estimate = announce(options, _calibration(options))
    if options.budget_s is not None and estimate > options.budget_s:
        print(f"{COMMAND}: this run needs about {estimate:.0f} s, more than --budget-s "
              f"{options.budget_s:g}: choose fewer --pairs, --processes or groups",
              file=sys.stderr)
        return 2
    if options.mode == "calibrate":
        run_calibration(options, argv, environ)
        return 0
    built = run(options, argv, environ)
    print("\n".join(screen(built)), flush=True)
    return 0


def screen(built: Dict[str, Any]) -> List[str]:
    """What a run prints last: the headline of its workloads and co-tenant, then the sleep
    group's lines; a run of the sleep group alone prints only those."""
    lines = []
    if built.get("workloads") or built.get("cotenant"):
        lines += markdown.headline(built)
    slept = built.get("sleep")
    if slept:
        lines += ["", "## Sleep and wake", ""] + [f"- {line}" for line in
                                                   sleep.summary_lines(slept)]
    return lines or markdown.headline(built)
