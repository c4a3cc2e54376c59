"""Where workers run: CPU lists, the GPU's node from a made-up sysfs, whole cores per worker (the
parent on the rest), sharing when cores are short, the fall-back when the node is not allowed,
and the settings of a process set with each setting turned off."""

import os

import pytest

from bench import affinity, isolation, sets


def test_cpu_lists_parse_and_format_both_ways():
    assert affinity.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert affinity.format_cpulist([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    with pytest.raises(ValueError):
        affinity.parse_cpulist("3-1")
    assert affinity.sysfs_bus_id("00000000:19:00.0") == "0000:19:00.0"
    assert affinity.sysfs_bus_id("00000001:C1:00.0") == "0001:c1:00.0"


def fake_sysfs(root, bus_id, local, siblings):
    device = root / "bus" / "pci" / "devices" / affinity.sysfs_bus_id(bus_id)
    device.mkdir(parents=True)
    (device / "local_cpulist").write_text(local + "\n")
    for cpu, mates in siblings.items():
        topology = root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "thread_siblings_list").write_text(mates)


@pytest.fixture
def sysfs(tmp_path):
    # Two nodes of 4 cores with 2 threads each: cpu c and c + 16 are siblings; the GPU is on
    # the second node (cpus 8-15 and 24-31).
    siblings = {c: f"{c % 16},{c % 16 + 16}" for c in range(32)}
    fake_sysfs(tmp_path, "00000000:19:00.0", "8-15,24-31", siblings)
    return tmp_path


def test_each_worker_gets_whole_cores_of_the_gpus_node_and_the_parent_the_rest(sysfs):
    placement = affinity.gpu_placement(["native", "native-aa", "streampool"],
                                       "00000000:19:00.0", range(32), sysfs)
    assert placement.workers == {"native": [8, 9, 24, 25], "native-aa": [10, 11, 26, 27],
                                 "streampool": [12, 13, 28, 29]}
    assert placement.parent == [14, 15, 30, 31]
    assert "2 core(s) a worker of 8 (the GPU's node" in placement.note
    cpus = [c for w in placement.workers.values() for c in w] + placement.parent
    assert len(cpus) == len(set(cpus))  # nobody shares a CPU


def test_cores_short_are_shared_in_turn_and_a_node_not_allowed_falls_back(sysfs):
    names = [f"w{i}" for i in range(10)]
    placement = affinity.gpu_placement(names, "00000000:19:00.0", range(32), sysfs)
    assert placement.workers["w0"] == placement.workers["w8"] == [8, 24]
    assert placement.parent == [] and "10 workers share 8 cores" in placement.note
    outside = affinity.gpu_placement(["a", "b"], "00000000:19:00.0", [0, 1, 16, 17], sysfs)
    assert outside.workers == {"a": [0, 16], "b": [1, 17]}
    assert "GPU's node: none allowed" in outside.note
    unknown = affinity.gpu_placement(["a"], None, [0, 1], sysfs)
    assert unknown.workers == {"a": [0]} and "no PCI bus id" in unknown.note


def test_a_process_set_with_every_setting_and_with_some_off(sysfs):
    names = ["native", "native-aa"]
    on = isolation.arrange(names, [], 2, "00000000:19:00.0", range(32), ("setarch", "-R"),
                           sysfs)
    # 8 cores, 2 workers: one core kept for the parent, 3 each, the parent the last 2
    assert on.env["native"][affinity.CPUS_VARIABLE] == "8-10,24-26"
    assert on.env["native-aa"][affinity.CPUS_VARIABLE] == "11-13,27-29"
    assert on.env["native-aa"]["BENCH_THREADS"] == on.env["native-aa"]["OMP_NUM_THREADS"] == "6"
    assert on.env["native"]["PYTHONHASHSEED"] == "0" and on.env["native"]["BENCH_PROCESS"] == "2"
    assert on.launcher == ("setarch", "-R") and on.parent_cpus == [14, 15, 30, 31]
    off = isolation.arrange(names, ["pin", "setup"], 0, "00000000:19:00.0", range(32),
                            ("setarch", "-R"), sysfs)
    assert affinity.CPUS_VARIABLE not in off.env["native"] and off.parent_cpus == []
    assert off.env["native"]["BENCH_THREADS"] == "16"  # 32 CPUs shared evenly
    assert "PYTHONHASHSEED" not in off.env["native"] and off.launcher == ()
    assert off.facts["off"] == ["pin", "setup"] and "settle" in off.facts["on"]


def test_a_worker_pins_itself_to_its_cpus():
    allowed = sorted(os.sched_getaffinity(0))
    try:
        assert affinity.apply({affinity.CPUS_VARIABLE: str(allowed[-1])}) == [allowed[-1]]
    finally:
        os.sched_setaffinity(0, allowed)
    assert affinity.apply({}) == allowed


def test_cpu_sets_rotate_among_the_workers_from_one_process_set_to_the_next(sysfs):
    # A configuration kept the same CPUs in every set (native 0-2, native-aa 3-5, ...): its
    # CPUs, the first of which take the interrupts, were confounded with the configuration.
    names = ["native", "native-aa", "streampool"]
    cpus = [isolation.arrange(names, [], index, "00000000:19:00.0", range(32), (), sysfs).facts
            ["cpus"] for index in range(4)]
    first, second, third = "8-9,24-25", "10-11,26-27", "12-13,28-29"
    assert cpus[0] == {"native": first, "native-aa": second, "streampool": third}
    assert cpus[1] == {"native": third, "native-aa": first, "streampool": second}
    assert cpus[2] == {"native": second, "native-aa": third, "streampool": first}
    assert cpus[3] == cpus[0]
    on = isolation.arrange(names, [], 1, "00000000:19:00.0", range(32), (), sysfs)
    assert on.env["native-aa"][affinity.CPUS_VARIABLE] == first
    assert "CPU sets rotated by 1" in on.facts["placement"]
    kept = isolation.arrange(names, ["rotate"], 1, "00000000:19:00.0", range(32), (), sysfs)
    assert kept.facts["cpus"] == cpus[0] and "rotated" not in kept.facts["placement"]


def test_in_an_ablation_the_sets_with_and_without_a_setting_take_the_same_rotations(sysfs):
    # By set index, with two workers the sets without the ablated setting (0, 2, 4, ...) took
    # only rotation 0 and the others only 1: which CPUs each configuration had was confounded
    # with the setting (native-aa ÷ native's CPUs, interrupts included, differed by arm).
    names = ["native", "native-aa"]
    arms = {True: [], False: []}
    for index in range(8):
        off = sets.off_in(index, [], ["autograd"])
        placed = isolation.arrange(names, off, index, "00000000:19:00.0", range(32), (), sysfs,
                                   rotation=sets.rotation_in(index, ["autograd"]))
        arms["autograd" in off].append(placed.facts["cpus"]["native"])
    assert sorted(arms[True]) == sorted(arms[False])
    assert len(set(arms[True])) == 2, "each arm takes both rotations"
    assert sets.rotation_in(5) == 5  # no ablation: by index, as before


def test_every_worker_of_a_set_launches_its_blocks_from_one_cpu_that_no_worker_owns(sysfs):
    # On CPUs of their own, a CPU that ran at half speed for seconds (as the H100's and H200's
    # virtual CPUs did, unseen by the guest) slowed one side of a pair and not the other: the
    # A/A's noise and its bias per process set. One launch CPU for all puts both sides there.
    names = ["native", "native-aa", "streampool"]
    for index in range(4):  # whatever the rotation
        on = isolation.arrange(names, [], index, "00000000:19:00.0", range(32), (), sysfs)
        assert {on.env[n][affinity.LAUNCH_VARIABLE] for n in names} == {"14"}
        assert on.facts["launch_cpu"] == 14 and 14 in on.parent_cpus
        assert all(14 not in affinity.parse_cpulist(on.env[n][affinity.CPUS_VARIABLE])
                   for n in names)
        assert "every block launched from CPU 14" in on.facts["placement"]
        assert all(affinity.moves_autograd(on.env[n]) for n in names)
        assert "autograd's threads with it" in on.facts["placement"]
    for without in (["launch"], ["pin"]):
        off = isolation.arrange(names, without, 1, "00000000:19:00.0", range(32), (), sysfs)
        assert not any(affinity.LAUNCH_VARIABLE in off.env[n] for n in names)
        assert not any(affinity.moves_autograd(off.env[n]) for n in names)
        assert off.facts.get("launch_cpu") is None
    # Without ``autograd``: the launching thread alone moves.
    alone = isolation.arrange(names, ["autograd"], 1, "00000000:19:00.0", range(32), (), sysfs)
    assert {alone.env[n][affinity.LAUNCH_VARIABLE] for n in names} == {"14"}
    assert not any(affinity.moves_autograd(alone.env[n]) for n in names)
    assert "autograd" not in alone.facts["placement"]
    # No spare core (cores short, or one each): a launch CPU would be a worker's, shared with
    # its other threads on one side of the pair only: none.
    short = affinity.gpu_placement([f"w{i}" for i in range(10)], "00000000:19:00.0",
                                   range(32), sysfs)
    assert short.launch is None and "no launch CPU" in short.note
    exact = affinity.place(["a", "b"], [[0], [1]], "two cores")
    assert exact.launch is None and exact.parent == []
    spare = affinity.place(["a", "b"], [[0], [1], [2]], "three cores")
    assert spare.launch == 2 and spare.parent == [2]
    assert affinity.launch_cpus({affinity.LAUNCH_VARIABLE: "15"}) == [15]
    assert affinity.launch_cpus({}) is None


def test_every_workers_arguments_and_environment_are_padded_to_the_same_count_and_bytes():
    # Without address-space randomisation the stack begins below the arguments and the
    # environment: native-aa's longer name (and CPU list) would move it in every process set.
    argvs = {"native": ["python3", "--base", "native"],
             "native-aa": ["python3", "--base", "native"],
             "streampool-vmm": ["python3", "--base", "streampool", "--backend", "pluggable"]}
    envs = {"native": {"BENCH_CONFIG": "native", "BENCH_CPUS": "0-2"},
            "native-aa": {"BENCH_CONFIG": "native-aa", "BENCH_CPUS": "12-14", "BENCH_PAD": "?"},
            "streampool-vmm": {"BENCH_CONFIG": "streampool-vmm", "STREAMPOOL_BACKEND": "vmm"}}
    padded = isolation.even_environments(argvs, envs)
    sizes = {n: (len(argvs[n]) + len(e), isolation._stack_bytes(argvs[n], e))
             for n, e in padded.items()}
    assert len(set(sizes.values())) == 1, sizes
    for name, env in envs.items():  # nothing else changes
        assert {k: v for k, v in padded[name].items() if not k.startswith("BENCH_PAD")} == {
            k: v for k, v in env.items() if k != "BENCH_PAD"}


def test_autograd_threads_are_found_by_name_and_a_thread_gone_meanwhile_is_skipped(tmp_path):
    for tid, name in ((101, "python3"), (102, "pt_autograd_0"), (103, "pt_autograd_1"),
                      (104, "pt_main_thread")):
        (tmp_path / str(tid)).mkdir()
        (tmp_path / str(tid) / "comm").write_text(name + "\n")
    (tmp_path / "105").mkdir()  # ended between the listing and the read: no comm
    assert affinity.autograd_threads(tmp_path) == [102, 103]
    assert affinity.autograd_threads(tmp_path / "absent") == []


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to tell apart")
def test_threads_moved_go_back_and_a_thread_gone_meanwhile_is_no_error():
    gone = 2**22 + 12345  # above any pid_max default: no such thread
    own = os.sched_getaffinity(0)
    one = sorted(own)[-1:]
    try:
        moved = affinity.move_threads([gone, 0], one)
        assert list(moved) == [0] and moved[0] == own
        assert os.sched_getaffinity(0) == set(one)
        affinity.restore_threads({gone: own, **moved})
        assert os.sched_getaffinity(0) == own
        # The calling thread cannot move (no CPU it may use): nothing stays moved, and it says so.
        with pytest.raises(OSError):
            affinity.move_threads([0], [max(own) + 4096])
        assert os.sched_getaffinity(0) == own
    finally:
        os.sched_setaffinity(0, own)
