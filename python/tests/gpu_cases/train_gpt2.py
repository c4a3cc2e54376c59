"""A small training script for ``streampool compare`` (and its GPU test): GPT-2 trained on random
tokens, one batch shape per step as in the benchmark's GPT-2 workload (batch 8, sequence lengths
128..1024 in steps of 128), the batches coming from a DataLoader with worker processes started
with spawn (so the workers are Python processes of the run too). It knows nothing of streampool:
compare chooses the allocator. Prints the last loss and PyTorch's peak of live tensor bytes.

    python -m streampool compare --plot gpt2.png -- python python/tests/gpu_cases/train_gpt2.py
"""

import argparse

import torch
import transformers

SEQUENCE_LENGTHS = range(128, 1025, 128)


class RandomTokens(torch.utils.data.Dataset):
    """Step i's batch: ``batch`` sequences of the i-th length of a fixed shuffled schedule."""

    def __init__(self, steps: int, batch: int, vocab: int, max_length: int):
        generator = torch.Generator().manual_seed(0)
        lengths = [n for n in SEQUENCE_LENGTHS if n <= max_length]
        picks = torch.randint(0, len(lengths), (steps,), generator=generator)
        self.lengths = [lengths[int(i)] for i in picks]
        self.batch, self.vocab = batch, vocab

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, step):
        generator = torch.Generator().manual_seed(step)
        return torch.randint(0, self.vocab, (self.batch, self.lengths[step]), generator=generator)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes (spawn)")
    parser.add_argument("--model", choices=["124M", "tiny"], default="124M",
                        help="124M: GPT-2 small; tiny: 2 layers of width 128 (for tests)")
    options = parser.parse_args()
    if options.model == "tiny":
        config = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=2, n_positions=1024)
    else:
        config = transformers.GPT2Config()
    config.attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = RandomTokens(options.steps, options.batch, config.vocab_size, config.n_positions)
    loader = torch.utils.data.DataLoader(
        data, batch_size=None, num_workers=options.workers,
        multiprocessing_context="spawn" if options.workers else None,
    )
    loss = None
    for tokens in loader:
        tokens = tokens.cuda(non_blocking=True)
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    print(f"steps {options.steps}, last loss {loss.item():.4f}, "
          f"peak live tensors {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
