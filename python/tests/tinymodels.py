"""A small transformer for the exporter's tests (and ``python3 -m
gorun.export tinymodels:transformer``). Written to be traceable by torch.fx
1.13: shapes come from the module's own constants, not from tensor.shape."""

import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, d, heads, seq):
        super().__init__()
        self.d, self.h, self.t = d, heads, seq
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        hd = self.d // self.h
        qkv = self.qkv(self.ln1(x)).split(self.d, dim=-1)
        q, k, v = qkv[0], qkv[1], qkv[2]  # indexing: fx cannot unpack a Proxy
        q = q.reshape(-1, self.t, self.h, hd).transpose(1, 2)
        k = k.reshape(-1, self.t, self.h, hd).transpose(1, 2)
        v = v.reshape(-1, self.t, self.h, hd).transpose(1, 2)
        att = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) / hd ** 0.5, dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(-1, self.t, self.d)
        x = x + self.proj(y)
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


class Transformer(nn.Module):
    def __init__(self, vocab=64, d=32, heads=4, seq=16, layers=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([Block(d, heads, seq) for _ in range(layers)])
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for blk in self.layers:
            x = blk(x)
        return self.head(x)


def transformer():
    torch.manual_seed(0)
    return Transformer(), torch.randint(0, 64, (4, 16))


class GPTBlock(nn.Module):
    """Pre-norm attention + MLP; attention by plain matmuls (no fused kernel)."""

    def __init__(self, d, heads):
        super().__init__()
        self.h = heads
        self.attention_norm = nn.LayerNorm(d)
        self.wqkv = nn.Linear(d, 3 * d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.ffn_norm = nn.LayerNorm(d)
        self.w1 = nn.Linear(d, 4 * d, bias=False)
        self.w2 = nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.wqkv(self.attention_norm(x)).split(d, dim=-1)
        q, k, v = (y.reshape(b, t, self.h, d // self.h).transpose(1, 2) for y in (q, k, v))
        att = torch.matmul(q, k.transpose(-2, -1)) / (d // self.h) ** 0.5
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(b, t, d)
        x = x + self.wo(y)
        return x + self.w2(torch.nn.functional.gelu(self.w1(self.ffn_norm(x))))


class GPT(nn.Module):
    """A GPT-like language model whose output projection is tied to the
    token embedding; forward(tokens, labels) returns the mean loss."""

    def __init__(self, vocab=128, d=64, heads=4, layers=4):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([GPTBlock(d, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(d)
        self.output = nn.Linear(d, vocab, bias=False)
        self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens, labels):
        x = self.tok_embeddings(tokens)
        for blk in self.layers:
            x = blk(x)
        logits = self.output(self.norm(x))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def gpt(vocab=128, d=64, heads=4, layers=4, batch=4, seq=32, seed=0):
    """A GPT and one rank's batch (tokens, labels)."""
    torch.manual_seed(seed)
    m = GPT(vocab, d, heads, layers)
    tokens = torch.randint(0, vocab, (batch, seq))
    return m, (tokens, torch.roll(tokens, -1, dims=1))
