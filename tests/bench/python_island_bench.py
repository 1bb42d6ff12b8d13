"""What atoll costs a Python training loop: the time per inner step of one loop (atoll's GPT of a
config, written in PyTorch: tests/python/atoll_gpt.py; the user's AdamW) without atoll, the same
loop as an atoll.Island of a run (its coordinator in this process, outer rounds every H steps),
and `atoll train` on the same model (C++), interleaved over --repeats so that the ratios of each
repeat are measured side by side; prints their medians.

    PYTHONPATH=tests/python ATOLL_BIN=build/src/atoll \\
        venv/bin/python tests/bench/python_island_bench.py --config deploy/configs/tiny.toml

(venv: a virtual environment with torch and the wheel, deploy/python_venv.sh; or Debian's
/usr/bin/python3 with PYTHONPATH=build/python:tests/python)
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib

import torch

import atoll
from atoll_gpt import Gpt


def loop(model, steps, tokens_fn, island=None):
    """Seconds per inner step over `steps` steps (after 3 warm-up steps), and of them the seconds
    per step spent in island.step()."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    start = None
    in_step = 0.0
    for i in range(steps + 3):
        if i == 3:
            start = time.perf_counter()
            in_step = 0.0
        x, y = tokens_fn()
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if island is not None:
            t0 = time.perf_counter()
            island.step(tokens=x.numel(), loss=loss)
            in_step += time.perf_counter() - t0
    return (time.perf_counter() - start) / steps, in_step / steps


def atoll_train_step_s(atoll_bin, config, steps, workdir):
    """`atoll train`'s seconds per step: the difference of two runs' wall times over the
    difference of their steps (start-up cancels out)."""
    times = []
    for n in (steps // 4, steps):
        run_dir = tempfile.mkdtemp(dir=workdir)
        t0 = time.perf_counter()
        subprocess.run([atoll_bin, "train", "--config", config, "--run-dir", run_dir,
                        f"--train.steps={n}", "--train.eval_every=0", "--train.checkpoint_every=0",
                        "--optim.warmup_steps=1"], check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return (times[1] - times[0]) / (steps - steps // 4)


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--config", default="deploy/configs/tiny.toml")
    a.add_argument("--steps", type=int, default=100)
    a.add_argument("--sync-every", type=int, default=50)
    a.add_argument("--repeats", type=int, default=3)
    args = a.parse_args()
    with open(args.config, "rb") as f:
        c = tomllib.load(f)
    m, t = c["model"], c.get("train", {})
    layers, d, heads, context = m["n_layer"], m["d_model"], m["n_head"], m["context"]
    vocab, batch = m.get("vocab", 256), t.get("batch_size", 8)
    threads = t.get("threads", 0) or os.cpu_count()
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)

    def tokens():
        x = torch.randint(0, vocab, (batch, context + 1), generator=g)
        return x[:, :-1], x[:, 1:]

    def model():
        torch.manual_seed(1)
        return Gpt(layers, d, heads, context, vocab)

    print(f"{args.config}: {sum(p.numel() for p in model().parameters()) / 1e6:.2f}M parameters, "
          f"batch {batch} x {context}, {threads} threads, H = {args.sync_every}, "
          f"{args.steps} steps per loop, {args.repeats} repeats")
    plain, island_s, in_step, cpp = [], [], [], []
    with tempfile.TemporaryDirectory() as workdir:
        for r in range(args.repeats):
            plain.append(loop(model(), args.steps, tokens)[0])
            net = model()
            run = {"outer": {"run_id": "bench", "islands": 1, "sync_every": args.sync_every},
                   "train": {"steps": args.steps + 3}}
            with atoll.Coordinator(run, model=net, tokens_per_step=batch * context,
                                   quiet=True) as coordinator:
                with atoll.Island(net, coordinator.address, config=run, name="bench",
                                  token=coordinator.token, quiet=True) as island:
                    per_step, atoll_s = loop(net, args.steps, tokens, island)
                    island_s.append(per_step)
                    in_step.append(atoll_s)
            cpp.append(atoll_train_step_s(os.environ["ATOLL_BIN"], args.config, args.steps, workdir))
            print(f"repeat {r}: plain loop {1e3 * plain[-1]:.1f} ms/step, atoll.Island "
                  f"{1e3 * island_s[-1]:.1f} ms/step (in island.step() {1e3 * in_step[-1]:.2f}), "
                  f"atoll train {1e3 * cpp[-1]:.1f} ms/step")
    overhead = statistics.median(i / p for i, p in zip(island_s, plain))
    vs_cpp = statistics.median(i / c for i, c in zip(island_s, cpp))
    print(f"atoll.Island / plain loop: {overhead:.3f}x (median of {args.repeats} ratios)")
    print(f"time in island.step(): {1e3 * statistics.median(in_step):.2f} ms per step, "
          f"{100 * statistics.median(a / i for a, i in zip(in_step, island_s)):.2f}% of the step "
          "(median; it includes the rounds' pushes and merges)")
    print(f"atoll.Island / atoll train: {vs_cpp:.3f}x (median of {args.repeats} ratios)")


if __name__ == "__main__":
    sys.exit(main())
