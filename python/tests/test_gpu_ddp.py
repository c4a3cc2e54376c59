"""Two-GPU test: DDP over NCCL training GPT-2 small (124M, transformers) for 50 steps, two
processes, under PyTorch's native allocator (twice: the native-vs-native difference), expandable
segments and streampool on the backend under test. Losses must equal native's within the
native-vs-native difference; each rank's peak device memory ÷ peak live bytes is printed as a
table beside native's and expandable segments'.
"""

import json
import math

import pytest
from helpers import describe, run_python
from test_gpu import gpu_env, tagged_line, two_gpus

DDP_GPT2 = r"""
import json, os, socket, sys
import torch, torch.distributed as dist, torch.multiprocessing as mp


def worker(rank, mode, port):
    if mode == "streampool":
        import streampool
        streampool.install()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda", rank))
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    from transformers import GPT2Config, GPT2LMHeadModel

    start_free, _ = torch.cuda.mem_get_info()
    model = GPT2LMHeadModel(GPT2Config()).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    generator = torch.Generator(device="cuda").manual_seed(100 + rank)
    losses, peak_used = [], 0
    for step in range(50):
        length = (128, 256, 192, 64, 256)[step % 5]
        ids = torch.randint(0, 50257, (8, length), device="cuda", generator=generator)
        loss = ddp(input_ids=ids, labels=ids).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        free, _ = torch.cuda.mem_get_info()
        peak_used = max(peak_used, start_free - free)
    if mode == "streampool":
        import streampool
        live = streampool.max_memory_allocated(rank)
    else:
        live = torch.cuda.max_memory_allocated(rank)
    line = json.dumps({"losses": losses, "peak_used": peak_used, "peak_live": live})
    os.write(1, f"RANK{rank} {line}\n".encode())  # one write: both ranks share the pipe
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(sys.argv[1], port), nprocs=2)
"""

RUNS = (
    ("native", "native", {}),
    ("native-aa", "native", {}),
    ("expandable", "native", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    ("streampool", "streampool", {}),
)


def _worst(a, b) -> float:
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


@two_gpus
def test_ddp_gpt2_small_losses_and_memory_per_device(capsys, tmp_path):
    pytest.importorskip("transformers")
    script = tmp_path / "ddp_gpt2.py"
    script.write_text(DDP_GPT2)
    runs = {}
    for label, mode, extra in RUNS:
        proc = run_python(args=[str(script), mode], env={**gpu_env(), **extra}, timeout=900)
        assert proc.returncode == 0, describe(proc)
        runs[label] = [json.loads(tagged_line(proc.stdout, f"RANK{r}")) for r in range(2)]
    aa = max(_worst(runs["native-aa"][r]["losses"], runs["native"][r]["losses"]) for r in range(2))
    ours = max(_worst(runs["streampool"][r]["losses"], runs["native"][r]["losses"]) for r in range(2))
    live = [runs["native"][r]["peak_live"] for r in range(2)]
    rows = []
    for label, _, _ in RUNS:
        ratios = [runs[label][r]["peak_used"] / live[r] for r in range(2)]
        rows.append(f"{label:<11} " + "  ".join(f"{x:.3f}" for x in ratios))
    with capsys.disabled():
        print("\nDDP GPT-2 small, 2 ranks x 50 steps: peak device memory / native's peak live bytes, per rank")
        print("\n".join(rows))
        print(f"largest relative loss difference to native: native-aa {aa:.2e}, streampool {ours:.2e}")
    assert ours <= max(aa, 1e-6), f"streampool's losses differ from native's by {ours:.2e} (native vs native {aa:.2e})"
