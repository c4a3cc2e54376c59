"""The sleep-and-wake benchmark's workload (bench/sleep.py has the method): GPT-2 124M (or a
stack of ``nn.Linear`` of about its size without transformers), AdamW, a few deterministic
training steps and an inference buffer; host snapshots of every tensor, compared bit for bit.

Invariant: imported only in the child, after its allocator is in place (it imports nothing of
torch's itself: torch comes in as an argument); every comparison is on host copies.
"""

import gc
from typing import Any, Dict, List

from . import protocol

BATCH, SEQ, TRAIN_STEPS, SEED = 8, 512, 3, 1234


def build_model(torch: Any, record: Any) -> Any:
    """GPT-2 124M from GPT2Config() with eager attention (deterministic); a stack of nn.Linear
    of about its size where transformers does not import or cannot build it."""
    try:
        return gpt2(torch, record)
    except Exception as exc:
        record["transformers_error"] = protocol.error_text(exc)
        record["facts"]["model"] = "a stack of nn.Linear, 134M (transformers failed: the record)"
        gc.collect()
        return LinearStack(torch)


def gpt2(torch: Any, record: Any) -> Any:
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    record["facts"]["transformers"] = transformers.__version__
    try:
        config = GPT2Config(attn_implementation="eager")
    except Exception:
        config = GPT2Config()
    with torch.device("cuda"):
        model = GPT2LMHeadModel(config)
    model = model.cuda().train()
    attention = getattr(model.config, "_attn_implementation", None)
    record["facts"]["model"] = f"GPT-2 124M (GPT2LMHeadModel, {attention} attention)"
    return model


def LinearStack(torch: Any) -> Any:  # noqa: N802  (a class made once torch is imported)
    nn = torch.nn

    class Stack(nn.Module):
        """Embedding, 12 blocks of Linear(768, 3072) + GELU + Linear(3072, 768), a head:
        about 134M parameters."""

        def __init__(self, vocab: int = 50257, width: int = 768, depth: int = 12) -> None:
            super().__init__()
            self.vocab = vocab
            self.embed = nn.Embedding(vocab, width)
            self.blocks = nn.ModuleList(
                nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
                for _ in range(depth))
            self.head = nn.Linear(width, vocab)

        def forward(self, input_ids: Any, labels: Any) -> Any:
            x = self.embed(input_ids)
            for block in self.blocks:
                x = x + block(x)
            logits = self.head(x)[:, :-1].float()
            loss = nn.functional.cross_entropy(logits.reshape(-1, self.vocab),
                                               labels[:, 1:].reshape(-1))
            return type("Out", (), {"loss": loss})()

    with torch.device("cuda"):
        return Stack().cuda().train()


class Workload:
    """The training state, the inference buffer, and their host snapshot."""

    def __init__(self, torch: Any, record: Any, buffer_bytes: int) -> None:
        self.torch = torch
        torch.manual_seed(SEED)
        self.model = build_model(torch, record)
        self.vocab = int(getattr(getattr(self.model, "config", None), "vocab_size", 0) or
                         getattr(self.model, "vocab", 50257))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.names = {p: n for n, p in self.model.named_parameters()}
        losses = [self.step(k) for k in range(TRAIN_STEPS)]
        record["training_losses"] = losses
        torch.cuda.manual_seed(SEED)
        self.buffer = torch.empty(buffer_bytes, dtype=torch.uint8, device="cuda")
        self.buffer.random_()  # every byte value
        torch.cuda.synchronize()
        self.snapshot: Dict[str, Any] = {}

    def step(self, k: int) -> float:
        """One training step on the k-th batch, its dropout seeded by k; the loss."""
        torch = self.torch
        generator = torch.Generator().manual_seed(SEED + k)
        tokens = torch.randint(0, self.vocab, (BATCH, SEQ), generator=generator).cuda()
        torch.manual_seed(SEED + 1000 + k)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = self.model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach().float().item())

    def tensors(self) -> Dict[str, Any]:
        """Every tensor of the state by name: parameters, buffers, optimizer state (including
        its host-side step counters), the inference buffer."""
        torch = self.torch
        found: Dict[str, Any] = {}
        for name, p in self.model.named_parameters():
            found[f"param:{name}"] = p
        for name, b in self.model.named_buffers():
            found[f"buffer:{name}"] = b
        for p, state in self.optimizer.state.items():
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    found[f"adamw:{self.names.get(p, id(p))}:{key}"] = value
        found["inference_buffer"] = self.buffer
        return found

    def live_bytes(self) -> int:
        """Bytes of the distinct device storages of the state."""
        storages = {}
        for tensor in self.tensors().values():
            if tensor.is_cuda:
                storage = tensor.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        return sum(storages.values())

    def take_snapshot(self) -> None:
        self.snapshot = {n: t.detach().to("cpu", copy=True) for n, t in self.tensors().items()}

    def restore(self) -> None:
        """The training state as the snapshot has it (the step's gradients are gone already;
        no step touches the inference buffer)."""
        with self.torch.no_grad():
            for name, tensor in self.tensors().items():
                if name != "inference_buffer":
                    tensor.copy_(self.snapshot[name])
        self.optimizer.zero_grad(set_to_none=True)
        self.torch.cuda.synchronize()

    def mismatches(self) -> List[str]:
        """Names of the device tensors that differ bit for bit from the snapshot."""
        torch = self.torch
        wrong = []
        for name, tensor in self.tensors().items():
            if not tensor.is_cuda:
                continue
            saved = self.snapshot[name]
            now = tensor.detach().to("cpu")
            if now.dtype.is_floating_point:  # bitwise, NaN included
                same = torch.equal(now.view(_int_of(torch, now.dtype)),
                                   saved.view(_int_of(torch, saved.dtype)))
            else:
                same = torch.equal(now, saved)
            if not same:
                wrong.append(name)
        return wrong

    def addresses(self) -> Dict[str, int]:
        return {n: t.data_ptr() for n, t in self.tensors().items() if t.is_cuda}

    def parameters_on_host(self) -> Dict[str, Any]:
        return {n: p.detach().to("cpu", copy=True) for n, p in self.model.named_parameters()}


def _int_of(torch: Any, dtype: Any) -> Any:
    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]


def same_parameters(torch: Any, a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[n].view(_int_of(torch, a[n].dtype)), b[n].view(_int_of(torch, b[n].dtype)))
        for n in a)
