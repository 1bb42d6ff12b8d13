"""atoll's GPT family (inner/model/gpt) written in PyTorch under atoll's parameter names (those
of `atoll export --names atoll`): pre-norm blocks of causal self-attention and a tanh-GELU MLP,
learned positions, an untied head. For the interop test and the benchmark."""

import math

import torch


class Block(torch.nn.Module):
    def __init__(self, d_model, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln1 = torch.nn.LayerNorm(d_model)
        self.attn = torch.nn.Module()
        self.attn.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.attn.proj = torch.nn.Linear(d_model, d_model)
        self.ln2 = torch.nn.LayerNorm(d_model)
        self.mlp = torch.nn.Module()
        self.mlp.fc = torch.nn.Linear(d_model, 4 * d_model)
        self.mlp.proj = torch.nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        b, t, d = x.shape
        h = self.n_head
        q, k, v = self.attn.qkv(self.ln1(x)).view(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // h)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        y = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.attn.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp.proj(torch.nn.functional.gelu(self.mlp.fc(self.ln2(x)), approximate="tanh"))


class Gpt(torch.nn.Module):
    def __init__(self, n_layer, d_model, n_head, context, vocab):
        super().__init__()
        self.tok_emb = torch.nn.Embedding(vocab, d_model)
        self.pos_emb = torch.nn.Embedding(context, d_model)
        self.blocks = torch.nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.ln_f = torch.nn.LayerNorm(d_model)
        self.head = torch.nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens):
        x = self.tok_emb(tokens) + self.pos_emb(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))
