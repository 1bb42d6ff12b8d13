"""Hugging Face's transformers, the real library (from PyPI: deploy/python_venv.sh installs it;
Debian 12 packages none, so python.* skips this file and python_pip.* runs it):

- atoll's Hugging Face export of a trained Llama loads in transformers.LlamaForCausalLM, and a
  directory transformers saves (save_pretrained) is read by atoll: greedy generation from it gives
  exactly `atoll generate --temperature 0`'s tokens;
- a transformers.LlamaForCausalLM built from a small config trains as an atoll.Island in a
  two-island Streaming run (FP4, 2 fragments, tau 1) over TCP: its loss falls, and every island's
  copy of every round's global parameters has the service's hash.
"""

import os

import pytest
import torch

import atoll
from conftest import CountingIsland, check_bit_identical_and_learning, run_atoll, train_run

transformers = pytest.importorskip("transformers")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TEXT = ("The islands trained one model between them, each on its own shore, and sent what they "
        "learned across the slow sea every fifty steps. ")


def from_pretrained(directory):
    try:  # transformers 5 names the dtype `dtype`, 4 `torch_dtype`
        return transformers.LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32)
    except TypeError:
        return transformers.LlamaForCausalLM.from_pretrained(directory, torch_dtype=torch.float32)


def test_atolls_llama_export_and_transformers_save_generate_the_same_tokens(tmp_path, atoll_bin):
    for split, copies in (("train.txt", 200), ("val.txt", 20)):
        (tmp_path / split).write_text(TEXT * copies)
    run = tmp_path / "run"
    trained = run_atoll(atoll_bin, "train", "--config", f"{ROOT}/deploy/configs/llama-tiny.toml",
                        "--run-dir", str(run), f"--data.path={tmp_path / 'train.txt'}",
                        f"--data.val_path={tmp_path / 'val.txt'}", "--train.steps=20",
                        "--train.eval_every=0", "--train.batch_size=4", "--optim.warmup_steps=5",
                        timeout=300)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    exported = tmp_path / "hf"
    r = run_atoll(atoll_bin, "export", str(run), "--format", "hf", "--out", str(exported))
    assert r.returncode == 0, r.stdout + r.stderr

    model = from_pretrained(exported)
    assert model.config.num_hidden_layers == 4 and model.config.num_key_value_heads == 2
    # Weights 25 x as peaked (norm gains spread around 1): no greedy choice is a near tie between
    # two float32 implementations, and the continuation follows the context. Saved by
    # transformers, read back by atoll.
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            else:
                p.mul_(25)
    saved = tmp_path / "saved"
    model.save_pretrained(saved)

    prompt = b"islands "
    r = run_atoll(atoll_bin, "generate", "--checkpoint", str(saved), "--prompt", prompt.decode(),
                  "--temperature", "0", "--tokens", "20")
    assert r.returncode == 0, r.stdout + r.stderr
    atolls = list(r.stdout.encode("latin-1")[len(prompt):len(prompt) + 20])
    ids = model.generate(torch.tensor([list(prompt)]), max_new_tokens=20, do_sample=False,
                         attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    theirs = ids[0, len(prompt):].tolist()
    assert len(set(theirs)) >= 4, theirs  # a continuation that says something
    assert atolls == theirs


def small_llama(seed):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=16,
                                      tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(config)


class HfIsland(CountingIsland):
    """With the loss the transformers model computes itself."""

    @staticmethod
    def loss(model, x):
        return model(input_ids=x, labels=x).loss


def test_a_transformers_llama_trains_as_an_island_bit_identical_to_the_service():
    config = {"outer": {"run_id": "hf-llama", "islands": 2, "sync_every": 4, "codec": "fp4_e2m1",
                        "error_feedback": True, "num_fragments": 2, "fragment_sync_delay": 1},
              "train": {"steps": 48}}
    islands, coordinator = train_run(small_llama(seed=1), config, island=HfIsland)
    check_bit_identical_and_learning(islands, coordinator)
