"""What each timed workload does on the device, one step at a time (runs in a worker process).

Invariant: a builder sets its workload up (model, optimizer, streams) and returns
``step(params)``, which runs one step of the schedule (schedules.py) and returns without
synchronising; a step allocates through whatever allocator the process installed and keeps no
reference to its tensors past the step except where the workload is about that (churn's window,
the model's parameters and optimizer state). Builders take ``device`` so that a CPU smoke test
can run them (all but multistream and compiled); torch is passed in, never imported at module
level.
"""

import collections
from typing import Any, Callable, Dict, Tuple

from . import schedules as s

Step = Callable[[Any], None]


def build_empty(torch: Any, device: str, size_bytes: int) -> Step:
    """A step of ``params`` pairs of ``torch.empty(size_bytes)`` + ``del``."""

    def step(pairs: int) -> None:
        for _ in range(pairs):
            x = torch.empty(size_bytes, dtype=torch.uint8, device=device)
            del x

    return step


def build_churn(torch: Any, device: str) -> Step:
    """A step allocates (and fills) a tensor of each size in ``params``, keeping the newest
    CHURN_WINDOW alive across steps."""
    live: collections.deque = collections.deque()

    def step(sizes_bytes: Tuple[int, ...]) -> None:
        for op, size_bytes in enumerate(sizes_bytes):
            live.append(torch.empty(size_bytes, dtype=torch.uint8, device=device).fill_(op % 251))
            if len(live) > s.CHURN_WINDOW:
                live.popleft()

    return step


def build_multistream(torch: Any, device: str) -> Step:
    """Products made on a side stream, consumed and freed on the main stream (record_stream).
    ``params`` is the side of the square bf16 matrix. CUDA only."""
    if device != "cuda":
        raise RuntimeError("multistream needs CUDA streams")
    side_stream, main_stream = torch.cuda.Stream(), torch.cuda.current_stream()
    torch.manual_seed(s.SEED)

    def step(side: int) -> None:
        matrix = torch.randn(side, side, device=device, dtype=torch.bfloat16)
        side_stream.wait_stream(main_stream)
        with torch.cuda.stream(side_stream):
            products = [matrix @ matrix for _ in range(s.MULTISTREAM_PRODUCTS)]
        matrix.record_stream(side_stream)
        main_stream.wait_stream(side_stream)
        total = torch.zeros_like(products[0])
        for product in products:
            product.record_stream(main_stream)
            total.add_(product)

    return step


def _half_dtype(torch: Any, device: str) -> Any:
    """fp16 on the GPU; bf16 on the CPU, where fp16 kernels are missing or slow."""
    return torch.float16 if device == "cuda" else torch.bfloat16


def build_llama_decode(torch: Any, device: str) -> Step:
    """Autoregressive decoding with a small Llama-style model (random weights, fp16): a step is
    one request ``(batch, prompt length)``: a prefill, then LLAMA_NEW_TOKENS - 1 single-token
    forwards, each growing the KV cache (DynamicCache concatenates: a new, larger tensor per
    layer per token). Greedy: the next token is the argmax, kept on the device."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(s.SEED)
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=1024,
    )
    with torch.device(device):  # initialise on the device: seconds faster than on the CPU
        model = LlamaForCausalLM(config)
    model = model.to(device=device, dtype=_half_dtype(torch, device)).eval()
    vocab = config.vocab_size

    def step(request: Tuple[int, int]) -> None:
        batch, prompt_length = request
        with torch.inference_mode():
            tokens = torch.randint(0, vocab, (batch, prompt_length), device=device)
            out = model(input_ids=tokens, use_cache=True, logits_to_keep=1)
            for _ in range(s.LLAMA_NEW_TOKENS - 1):
                next_tokens = out.logits[:, -1:].argmax(dim=-1)
                out = model(
                    input_ids=next_tokens,
                    past_key_values=out.past_key_values,
                    use_cache=True,
                    logits_to_keep=1,
                )
            del out

    return step


def build_bert(torch: Any, device: str) -> Step:
    """BERT-base encoder inference (random weights, fp16): a step is one call of
    ``(batch, sequence length)``."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(s.SEED)
    config = BertConfig()
    with torch.device(device):
        model = BertModel(config)
    model = model.to(device=device, dtype=_half_dtype(torch, device)).eval()
    vocab = config.vocab_size

    def step(shape: Tuple[int, int]) -> None:
        batch, length = shape
        with torch.inference_mode():
            tokens = torch.randint(0, vocab, (batch, length), device=device)
            mask = torch.ones((batch, length), dtype=torch.long, device=device)
            model(input_ids=tokens, attention_mask=mask)

    return step


def build_gpt2(torch: Any, device: str) -> Step:
    """GPT-2 124M training from its config (random weights), AdamW, bf16 autocast, batch
    GPT2_BATCH; ``params`` is the sequence length."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(s.SEED)
    with torch.device(device):
        model = GPT2LMHeadModel(GPT2Config())
    model = model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    vocab = model.config.vocab_size

    def step(length: int) -> None:
        tokens = torch.randint(0, vocab, (s.GPT2_BATCH, length), device=device)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    # The co-tenant's process A keeps these alive while it idles.
    step.model, step.optimizer = model, optimizer  # type: ignore[attr-defined]
    return step


def _resnet50_training(torch: Any, device: str) -> Callable[[int, int, int], None]:
    """A training step of ResNet-50 (random weights), channels_last, bf16 autocast, SGD, on a
    batch of random images of the given (batch, height, width)."""
    import torchvision

    torch.manual_seed(s.SEED)
    with torch.device(device):
        model = torchvision.models.resnet50()
    model = model.to(device, memory_format=torch.channels_last).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def train(batch: int, height: int, width: int) -> None:
        images = torch.empty(
            (batch, 3, height, width), device=device, memory_format=torch.channels_last
        ).normal_()
        labels = torch.randint(0, 1000, (batch,), device=device)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return train


def build_resnet50(torch: Any, device: str) -> Step:
    """ResNet-50 training; ``params`` is the batch of RESNET_IMAGE_SIDE-square images."""
    train = _resnet50_training(torch, device)
    side = s.RESNET_IMAGE_SIDE

    def step(batch: int) -> None:
        train(batch, side, side)

    return step


def build_vision_sizes(torch: Any, device: str) -> Step:
    """ResNet-50 training; ``params`` is (batch, height, width) of the step's images, a new shape
    every step (multi-scale training)."""
    train = _resnet50_training(torch, device)

    def step(shape: Tuple[int, int, int]) -> None:
        train(*shape)

    return step


def build_compiled(torch: Any, device: str) -> Step:
    """Inference of a small pre-norm transformer (4 blocks, width 1024, bf16, random weights)
    through ``torch.compile(mode="reduce-overhead")``: CUDA graphs recorded per (batch, length)
    and replayed. ``params`` is (batch, length). PyTorch's graph trees check the allocator's
    live blocks, which a pluggable allocator cannot answer: such a configuration fails here,
    and the report says so."""
    nn, functional = torch.nn, torch.nn.functional
    width, heads, layers = 1024, 16, 4

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x: Any) -> Any:
            batch, length, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(batch, length, 3, heads, -1).unbind(2)
            attended = functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
            x = x + self.out(attended.transpose(1, 2).reshape(batch, length, width))
            return x + self.down(functional.gelu(self.up(self.norm2(x))))

    torch.manual_seed(s.SEED)
    with torch.device(device):
        model = nn.Sequential(*[Block() for _ in range(layers)])
    model = model.to(device=device, dtype=torch.bfloat16).eval()
    compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)

    def step(shape: Tuple[int, int]) -> None:
        batch, length = shape
        with torch.no_grad():
            torch.compiler.cudagraph_mark_step_begin()
            inputs = torch.randn(batch, length, width, device=device, dtype=torch.bfloat16)
            compiled(inputs)

    return step


def build(torch: Any, workload: str, device: str = "cuda") -> Step:
    """The step function of ``workload`` (one of schedules.TIMED_WORKLOADS)."""
    if workload in s.EMPTY_SIZES_BYTES:
        return build_empty(torch, device, s.EMPTY_SIZES_BYTES[workload])
    return BUILDERS[workload](torch, device)


BUILDERS: Dict[str, Callable[[Any, str], Step]] = {
    "churn": build_churn,
    "multistream": build_multistream,
    "llama_decode": build_llama_decode,
    "bert": build_bert,
    "gpt2": build_gpt2,
    "resnet50": build_resnet50,
    "vision_sizes": build_vision_sizes,
    "compiled": build_compiled,
}
