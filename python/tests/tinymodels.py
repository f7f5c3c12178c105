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
