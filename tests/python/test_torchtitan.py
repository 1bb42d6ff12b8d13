"""torchtitan's Llama 3 (torchtitan 0.3.0 from PyPI) trains as an atoll.Island in a two-island
Streaming run (FP4, 2 fragments, tau 1) over TCP: its loss falls, and every island's copy of every
round's global parameters has the service's hash.

Skipped where torchtitan does not import: it is not in deploy/python_venv.sh's environment, whose
torch 2.11 (the GPU machines') is older than torchtitan 0.3.0 needs (it imports
torch.distributed.fsdp.DataParallelMeshDims). Run it in a venv with torch 2.15:
`pip install torch==2.15.0 torchtitan==0.3.0 pytest` and the wheel, then
`ATOLL_BIN=build/src/atoll venv/bin/python -m pytest tests/python/test_torchtitan.py`.

On the CPU torchtitan's Llama trains with PyTorch's scaled-dot-product attention: its presets use
flex attention, whose backward torch does not run on the CPU ("FlexAttention does not support
backward on CPU"), so each layer's attention is switched to SDPA after the layers are built (with
torchtitan's own builder, a private function of torchtitan 0.3, which the venv pins)."""

import pytest
import torch

from conftest import CONTEXT, VOCAB, CountingIsland, check_bit_identical_and_learning, train_run

try:
    import torchtitan.models.llama3 as L3
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common import compute_ffn_hidden_dim
    from torchtitan.models.common.attention import ScaledDotProductAttention
except ImportError as e:  # not installed, or not for this torch
    pytest.skip(f"torchtitan does not import here: {e}", allow_module_level=True)


def tiny_llama3(seed):
    torch.manual_seed(seed)
    dim, heads = 32, 4
    layers = L3._build_llama3_layers(
        n_layers=2, dim=dim, n_heads=heads, n_kv_heads=2, fuse_qkv=True,
        hidden_dim=compute_ffn_hidden_dim(dim, multiple_of=32),
        rope=ComplexRoPE.Config(dim=dim // heads, max_seq_len=CONTEXT, theta=10000.0),
        attn_backend="flex")
    for layer in layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()  # trains on the CPU
    config = L3.Llama3Model.Config(
        dim=dim, vocab_size=VOCAB,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=dim,
                                        param_init=L3._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=L3._NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=VOCAB,
                              param_init=L3._output_linear_init(dim)),
        layers=layers)
    model = config.build()
    model.init_states()
    return model


def next_token_loss(model, x):
    logits = model(x[:, :-1])
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten())


class TitanIsland(CountingIsland):
    loss = staticmethod(next_token_loss)


def test_a_torchtitan_llama_trains_as_an_island_bit_identical_to_the_service():
    config = {"outer": {"run_id": "titan-llama", "islands": 2, "sync_every": 4,
                        "codec": "fp4_e2m1", "error_feedback": True, "num_fragments": 2,
                        "fragment_sync_delay": 1},
              "train": {"steps": 48}}
    islands, coordinator = train_run(tiny_llama3(seed=1), config, island=TitanIsland)
    check_bit_identical_and_learning(islands, coordinator)
