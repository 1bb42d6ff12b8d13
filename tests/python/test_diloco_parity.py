"""Two Python islands and an atoll coordinator over TCP train a model atoll does not have with the
user's own AdamW; the result is plain-PyTorch DiLoCo's (the reference below: the average of the
pseudo-gradients and a Nesterov outer step, in fp32) to 1e-6."""

import copy

import torch

import atoll
from conftest import MlpLm, batches, inner_step, make_optimizer, train_run

H, STEPS, OUTER_LR, MOMENTUM = 4, 16, 0.7, 0.9


def reference_diloco(init, seeds):
    """DiLoCo (arXiv 2311.08105) in plain PyTorch: each replica trains H steps with its own AdamW
    (kept across rounds); the global parameters move by the Nesterov step on the mean of the
    pseudo-gradients (global - local), and every replica restarts from them."""
    replicas = [copy.deepcopy(init) for _ in seeds]
    optimizers = [make_optimizer(r) for r in replicas]
    streams = [batches(s) for s in seeds]
    global_params = [p.detach().clone() for p in init.parameters()]
    momentum = [torch.zeros_like(p) for p in global_params]
    for _ in range(STEPS // H):
        for replica, optimizer, stream in zip(replicas, optimizers, streams):
            for _ in range(H):
                inner_step(replica, optimizer, next(stream))
        with torch.no_grad():
            for i, g in enumerate(global_params):
                delta = sum(g - list(r.parameters())[i] for r in replicas) / len(replicas)
                momentum[i] = MOMENTUM * momentum[i] + delta
                g -= OUTER_LR * (delta + MOMENTUM * momentum[i])
            for replica in replicas:
                for p, g in zip(replica.parameters(), global_params):
                    p.copy_(g)
    return global_params


def test_two_python_islands_equal_plain_pytorch_diloco():
    init = MlpLm(seed=7)
    config = {"outer": {"run_id": "parity", "islands": 2, "sync_every": H, "lr": OUTER_LR,
                        "momentum": MOMENTUM},
              "train": {"steps": STEPS}}
    islands, coordinator = train_run(init, config)
    assert coordinator.committed_rounds == STEPS // H
    expected = reference_diloco(init, (0, 1))
    for island in islands:
        assert island.island.steps == STEPS
        for (name, p), e in zip(island.model.named_parameters(), expected):
            diff = (p.detach() - e).abs().max().item()
            assert diff <= 1e-6, f"{island.island_name} {name}: {diff:.3g} from plain DiLoCo"
    # Every island ends on the service's final parameters, bit for bit.
    a, b = (list(i.model.parameters()) for i in islands)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    final = torch.cat([p.detach().flatten() for p in a])
    assert atoll.params_hash(final) == coordinator.params_hashes[0]
    assert torch.equal(final, coordinator.params()[0])
    # The loss fell: the run trained.
    assert sum(islands[0].losses[-4:]) < sum(islands[0].losses[:4])
