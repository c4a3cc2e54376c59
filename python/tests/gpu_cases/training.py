"""GPU cases: real models trained for a few hundred steps (``case_<name>(ctx)``).

Each prints ``LOSSES <json list>``; test_gpu runs a case under the native allocator and under
streampool and compares the lists. Seeds and deterministic settings make the runs comparable.
Each case also checks that deleting the model brings live bytes back to the baseline (and, with
streampool, its pools' used and reserved bytes and the device's free memory: run.Context), and
that parameters and gradients are 512-byte aligned.
"""

import json

import torch

STEPS = 200
QUICK_STEPS = 5


def _deterministic(seed: int = 0) -> None:
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # Some kernels (adaptive average pooling backward) have no deterministic version: warn only.
    torch.use_deterministic_algorithms(True, warn_only=True)


def _train(ctx, build_model, make_batch, loss_of) -> None:
    """Trains ``build_model()`` on batches from ``make_batch()`` and prints the losses; then
    deletes the model and checks that live bytes are back where they were before it existed."""
    baseline = ctx.baseline()
    model = build_model()
    ctx.check_aligned(*model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses = []
    for _ in range(QUICK_STEPS if ctx.quick else STEPS):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(model, make_batch())
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    print("LOSSES " + json.dumps(losses))
    ctx.check_aligned(*(p.grad for p in model.parameters() if p.grad is not None))
    del model, optimizer, loss
    ctx.assert_back_to(baseline, "after training")


def case_resnet18(ctx) -> None:
    """torchvision resnet18, random init, batches of 16 random 64x64 images, 10 classes."""
    import torchvision

    _deterministic()
    generator = torch.Generator(device="cuda").manual_seed(1)

    def make_batch():
        images = torch.randn(16, 3, 64, 64, device="cuda", generator=generator)
        labels = torch.randint(0, 10, (16,), device="cuda", generator=generator)
        return images, labels

    def loss_of(model, batch):
        images, labels = batch
        return torch.nn.functional.cross_entropy(model(images), labels)

    _train(ctx, lambda: torchvision.models.resnet18(num_classes=10).cuda(), make_batch, loss_of)


def case_gpt2(ctx) -> None:
    """GPT-2 small (124M, the default GPT2Config), random init, eager attention, no dropout,
    batches of 8 sequences of 128 tokens."""
    import transformers

    _deterministic()
    config = transformers.GPT2Config(
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        attn_implementation="eager",
    )
    generator = torch.Generator(device="cuda").manual_seed(1)

    def make_batch():
        return torch.randint(0, config.vocab_size, (8, 128), device="cuda", generator=generator)

    def loss_of(model, tokens):
        return model(input_ids=tokens, labels=tokens).loss

    _train(ctx, lambda: transformers.GPT2LMHeadModel(config).cuda(), make_batch, loss_of)
