#!/usr/bin/env python3
"""An independent reading of a Hugging Face LlamaForCausalLM directory, in numpy (float64).

Written from the architecture's definition (Hugging Face's modeling_llama: RMSNorm, rotate-half
rotary embeddings, repeat_kv grouped-query attention, SwiGLU MLP, tied or untied head), sharing
no code with atoll. Prints the greedy continuation of a byte-level prompt as token ids, one per
line, recomputing the last `max_position_embeddings` tokens from position 0 for each new token.

  hf_llama_reference.py DIR PROMPT TOKENS
"""
import json
import os
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        raw = data[begin:end]
        if e["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4").astype(np.float64)
        elif e["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        else:
            raise SystemExit(f"{name}: dtype {e['dtype']}")
        out[name] = a.reshape(e["shape"])
    return out


def load(directory):
    index = os.path.join(directory, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) \
        else ["model.safetensors"]
    w = {}
    for f in files:
        w.update(read_safetensors(os.path.join(directory, f)))
    return json.load(open(os.path.join(directory, "config.json"))), w


def rms_norm(x, weight, eps):
    return weight * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def forward(cfg, w, tokens):
    d, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    hd = d // heads
    t = len(tokens)
    inv_freq = 1.0 / (cfg.get("rope_theta", 10000.0) ** (np.arange(0, hd, 2) / hd))
    angles = np.outer(np.arange(t), inv_freq)
    emb = np.concatenate([angles, angles], axis=-1)
    cos, sin = np.cos(emb), np.sin(emb)
    mask = np.triu(np.full((t, t), -np.inf), k=1)
    x = w["model.embed_tokens.weight"][tokens]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], cfg["rms_norm_eps"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(t, heads, hd).transpose(1, 0, 2)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(t, kv_heads, hd).transpose(1, 0, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(t, kv_heads, hd).transpose(1, 0, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = np.repeat(k, heads // kv_heads, axis=0)  # repeat_kv: head i reads kv head i // rep
        v = np.repeat(v, heads // kv_heads, axis=0)
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + mask
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        attn = (scores / scores.sum(-1, keepdims=True)) @ v
        x = x + attn.transpose(1, 0, 2).reshape(t, d) @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg["rms_norm_eps"])
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], cfg["rms_norm_eps"])
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    return x @ head.T


def main():
    directory, prompt, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cfg, w = load(directory)
    assert cfg["architectures"] == ["LlamaForCausalLM"], cfg["architectures"]
    tokens = list(prompt.encode())
    context = cfg["max_position_embeddings"]
    for _ in range(count):
        window = tokens[-context:]
        tokens.append(int(np.argmax(forward(cfg, w, window)[-1])))
        print(tokens[-1])


if __name__ == "__main__":
    main()
