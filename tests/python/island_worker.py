"""One Python island in its own process, for the restart and SIGTERM tests: trains conftest's MlpLm
with its own AdamW, checkpoints its module, optimizer and atoll state every --checkpoint-every
steps, and can SIGKILL (--die-at: a crash) or SIGTERM (--term-at: a shutdown) itself after a known
step. Started again with the same checkpoint, it resumes from it and rejoins."""

import argparse
import json
import os
import signal

import torch

import atoll
from conftest import TOKENS_PER_STEP, MlpLm, batches, inner_step, make_optimizer


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--coordinator", required=True)
    a.add_argument("--name", required=True)
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--config", required=True, help="JSON of the island's config")
    a.add_argument("--checkpoint", required=True)
    a.add_argument("--checkpoint-every", type=int, default=4)
    a.add_argument("--die-at", type=int, default=0)
    a.add_argument("--term-at", type=int, default=0, help="SIGTERM itself after this step")
    args = a.parse_args()

    model = MlpLm(seed=3)
    optimizer = make_optimizer(model)
    state = None
    if os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state = saved["atoll"]
        print(f"resuming at step {state['step']}", flush=True)
    data = batches(args.seed + 100 * (state["step"] if state else 0))
    with atoll.Island(model, args.coordinator, name=args.name, config=json.loads(args.config),
                      state=state, credential_file=args.checkpoint + ".credential") as island:
        while True:
            loss = inner_step(model, optimizer, next(data))
            going = island.step(tokens=TOKENS_PER_STEP, loss=loss)
            if going and island.steps % args.checkpoint_every == 0:
                tmp = args.checkpoint + ".tmp"
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "atoll": island.state_dict()}, tmp)
                os.replace(tmp, args.checkpoint)
                print(f"checkpoint {island.steps}", flush=True)
            if going and island.steps == args.die_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if going and island.steps == args.term_at:
                os.kill(os.getpid(), signal.SIGTERM)
            if not going:
                break
        print(json.dumps({"steps": island.steps, "hashes": island.fragment_hashes,
                          "stats": island.stats}), flush=True)


if __name__ == "__main__":
    main()
