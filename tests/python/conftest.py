"""Shared pieces of the Python package's tests: a small language model atoll does not have, its
data, islands on threads, and the `atoll` binary (ATOLL_BIN, set by ctest)."""

import copy
import os
import subprocess
import threading

import pytest
import torch

import atoll

torch.set_num_threads(1)  # deterministic and fair on 2 cores: every island a thread of its own

VOCAB, CONTEXT, BATCH = 32, 8, 4
TOKENS_PER_STEP = BATCH * CONTEXT


class MlpLm(torch.nn.Module):
    """A next-token MLP over a window of embeddings: a model atoll does not build."""

    def __init__(self, d=16, hidden=64, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = torch.nn.Embedding(VOCAB, d)
        self.fc1 = torch.nn.Linear(CONTEXT * d, hidden)
        self.fc2 = torch.nn.Linear(hidden, hidden)
        self.out = torch.nn.Linear(hidden, VOCAB)

    def forward(self, x):
        h = self.emb(x).flatten(1)
        h = torch.nn.functional.gelu(self.fc1(h))
        h = torch.nn.functional.gelu(self.fc2(h))
        return self.out(h)


def batches(seed):
    """An island's own data stream: windows of a fixed random sequence with a learnable rule
    (each token depends on the two before it)."""
    g = torch.Generator().manual_seed(1000 + seed)
    n = 4096
    seq = torch.zeros(n, dtype=torch.long)
    seq[:2] = torch.randint(0, VOCAB, (2,), generator=g)
    noise = torch.randint(0, VOCAB, (n,), generator=g)
    for i in range(2, n):
        seq[i] = (seq[i - 1] * 3 + seq[i - 2] + (noise[i] % 3)) % VOCAB
    while True:
        starts = torch.randint(0, n - CONTEXT - 1, (BATCH,), generator=g)
        x = torch.stack([seq[s:s + CONTEXT] for s in starts])
        y = torch.stack([seq[s + CONTEXT] for s in starts])
        yield x, y


def inner_step(model, optimizer, batch):
    x, y = batch
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.detach()


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)


class IslandThread(threading.Thread):
    """An island that trains `model` on data stream `seed` with the user's own AdamW until the run
    is over; its error, if any, is kept for the test."""

    def __init__(self, model, coordinator, name, seed, **island_args):
        super().__init__(name=name, daemon=True)
        self.model, self.coordinator, self.island_name, self.seed = model, coordinator, name, seed
        self.island_args = island_args
        self.error = None
        self.island = None
        self.losses = []

    def run(self):
        try:
            optimizer = make_optimizer(self.model)
            data = batches(self.seed)
            with atoll.Island(self.model, self.coordinator, name=self.island_name, quiet=True,
                              handle_sigterm=False, **self.island_args) as island:
                self.island = island
                while True:
                    loss = inner_step(self.model, optimizer, next(data))
                    self.losses.append(float(loss))
                    if not island.step(tokens=TOKENS_PER_STEP, loss=loss):
                        break
        except BaseException as e:  # noqa: BLE001  (reported by the test)
            self.error = e


class CountingIsland(IslandThread):
    """An island training a causal LM of a library's own (transformers, torchtitan) on its own
    stream of a learnable sequence: counting on from a random start, mod VOCAB, 4 x 8 tokens a
    step. `loss(model, x)`: the model's next-token loss on x."""

    loss = None

    def run(self):
        try:
            optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
            g = torch.Generator().manual_seed(100 + self.seed)
            with atoll.Island(self.model, self.coordinator, name=self.island_name, quiet=True,
                              handle_sigterm=False, **self.island_args) as island:
                self.island = island
                while True:
                    start = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
                    x = (start + torch.arange(CONTEXT)) % VOCAB
                    loss = self.loss(self.model, x)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    self.losses.append(loss.item())
                    if not island.step(tokens=x.numel(), loss=loss):
                        break
        except BaseException as e:  # noqa: BLE001  (reported by the test)
            self.error = e


def check_bit_identical_and_learning(islands, coordinator):
    """Every island's copy of every round's global parameters has the service's hash, each ends
    on the service's final parameters, and each island's loss fell to under half."""
    service = {(r["fragment"], r["round"]): int(r["params_hash"], 16) for r in coordinator.rounds}
    for t in islands:
        assert t.island.landed, "no round landed"
        for landed in t.island.landed:
            assert landed["global_hash"] == service[(landed["fragment"], landed["round"])], landed
        assert t.island.fragment_hashes == coordinator.params_hashes
        first, last = sum(t.losses[:8]) / 8, sum(t.losses[-8:]) / 8
        assert last < 0.5 * first, (first, last)


def run_islands(threads, timeout_s=120):
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
        assert not t.is_alive(), f"island {t.island_name} did not finish in {timeout_s} s"
        if t.error is not None:
            raise t.error


def train_run(init, config, seeds=(0, 1), island=None):
    """A run of `config` over `init` (a module atoll does not build): an atoll.Coordinator and an
    island per seed (an IslandThread, or the subclass `island`), each on its own copy of `init`,
    until the run is over. The islands, and the coordinator (stopped: its rounds, hashes and
    parameters are those it ended with)."""
    island = island or IslandThread
    with atoll.Coordinator(config, model=init, tokens_per_step=TOKENS_PER_STEP,
                           quiet=True) as coordinator:
        islands = [island(copy.deepcopy(init), coordinator.address, f"island{s}", s,
                          config=config, token=coordinator.token) for s in seeds]
        run_islands(islands)
        assert coordinator.wait(30), "the coordinator did not end after its islands"
    return islands, coordinator


@pytest.fixture
def atoll_bin():
    path = os.environ.get("ATOLL_BIN")
    if not path or not os.path.exists(path):
        pytest.fail("ATOLL_BIN must name the atoll binary (ctest sets it)")
    return path


def run_atoll(atoll_bin, *args, timeout=120):
    return subprocess.run([atoll_bin, *args], capture_output=True, text=True, timeout=timeout)
