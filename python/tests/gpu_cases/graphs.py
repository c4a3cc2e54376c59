"""GPU cases: CUDA graph capture and replay through streampool (``case_<name>(ctx)``)."""

import copy

import torch

MiB = 1 << 20


def _mlp(d_in: int, hidden: int, d_out: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(d_in, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, d_out)
    ).cuda()


def _bystanders(step: int) -> list:
    """Tensors allocated around a replay, filled with a marker the graph must not overwrite; each
    512-byte aligned."""
    tensors = [torch.full((size,), 7.0, device="cuda") for size in (1024, 64 * 1024 + step, MiB // 4, MiB)]
    for t in tensors:
        assert t.data_ptr() % 512 == 0, f"a bystander at {t.data_ptr():#x} is not 512-byte aligned"
    return tensors


def case_graph_whole_network(ctx) -> None:
    """PyTorch's whole-network capture recipe: replays match an eager copy while other tensors
    are allocated and freed between replays and stay intact during them."""
    torch.manual_seed(0)
    n, d_in, hidden, d_out = 64, 1024, 2048, 512
    model = _mlp(d_in, hidden, d_out)
    loss_fn = torch.nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    static_input = torch.randn(n, d_in, device="cuda")
    static_target = torch.randn(n, d_out, device="cuda")

    warmup = torch.cuda.Stream()
    warmup.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warmup):
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(static_input), static_target).backward()
            optimizer.step()
    torch.cuda.current_stream().wait_stream(warmup)

    eager_model = copy.deepcopy(model)
    eager_optimizer = torch.optim.SGD(eager_model.parameters(), lr=0.1)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = loss_fn(model(static_input), static_target)
        static_loss.backward()
        optimizer.step()

    for step in range(10):
        data, target = torch.randn(n, d_in, device="cuda"), torch.randn(n, d_out, device="cuda")
        freed = _bystanders(step)
        del freed  # memory allocated and freed between replays
        kept = _bystanders(step)
        static_input.copy_(data)
        static_target.copy_(target)
        graph.replay()
        eager_optimizer.zero_grad(set_to_none=True)
        eager_loss = loss_fn(eager_model(data), target)
        eager_loss.backward()
        eager_optimizer.step()
        torch.cuda.synchronize()
        assert all(bool((t == 7.0).all()) for t in kept), f"replay {step} overwrote a live tensor"
        assert torch.allclose(static_loss, eager_loss, rtol=1e-4, atol=1e-6), (step, static_loss, eager_loss)
    for graphed, eager in zip(model.parameters(), eager_model.parameters()):
        assert torch.allclose(graphed, eager, rtol=1e-4, atol=1e-6)


def case_graph_make_graphed_callables(ctx) -> None:
    """torch.cuda.make_graphed_callables: forward and backward match an eager copy while other
    tensors are allocated and freed between replays and stay intact during them."""
    torch.manual_seed(0)
    module = _mlp(512, 1024, 256)
    eager = copy.deepcopy(module)
    sample = torch.randn(32, 512, device="cuda", requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(module, (sample,))
    for step in range(5):
        x = torch.randn(32, 512, device="cuda", requires_grad=True)
        x_eager = x.detach().clone().requires_grad_()
        freed = _bystanders(step)
        del freed  # memory allocated and freed between replays
        kept = _bystanders(step)
        out = graphed(x)  # replays the forward graph
        between = _bystanders(step + 1)  # allocated between the forward and backward replays
        out.square().sum().backward()  # replays the backward graph
        reference = eager(x_eager)
        reference.square().sum().backward()
        torch.cuda.synchronize()
        assert all(bool((t == 7.0).all()) for t in kept + between), f"replay {step} overwrote a live tensor"
        assert torch.allclose(out, reference, rtol=1e-4, atol=1e-5), step
        assert torch.allclose(x.grad, x_eager.grad, rtol=1e-4, atol=1e-5), step
        for p, q in zip(module.parameters(), eager.parameters()):
            assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-5), step
        module.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
