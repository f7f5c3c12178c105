"""Trains a small GPT-like model with gorun.torch: the plan built from the
module, run by gorun's executor.

    make build lib
    bin/gorun -np 4 /root/.cache/gorun/venv/bin/python examples/torch/step.py --mode fsdp
    bin/gorun -np 4 ... examples/torch/step.py --mode hsdp --shard-size 2 --trace /tmp/step-{rank}.json

Rank 0 prints the loss, then the step's metrics (step time, exposed
communication, buckets, peak gathered parameters) and where the Perfetto
trace went (open it at https://ui.perfetto.dev).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
os.environ.setdefault("GORUN_BIN", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bin", "gorun"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gorun.torch  # noqa: E402


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        h = self.ln(x)
        t = x.shape[1]
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(x)


class GPT(nn.Module):
    def __init__(self, vocab=128, d=64, layers=4):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))  # each block is a region
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied: one member, read by tok and head

    def forward(self, idx, targets):
        x = self.tok(idx)
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="ddp", choices=gorun.torch.MODES)
    ap.add_argument("--shard-size", type=int, default=None)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--trace", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = gorun.torch.distribute(GPT(), mode=args.mode, shard_size=args.shard_size, trace=args.trace)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rank = model.rank
    g = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        idx = torch.randint(0, 128, (8, 32), generator=g)
        loss = model(idx, torch.roll(idx, -1, 1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        if rank == 0 and step % 10 == 0:
            print("step %d loss %.4f" % (step, loss.item()), flush=True)
    m = model.metrics()
    state = model.full_state_dict()  # collective in fsdp/hsdp mode
    if rank == 0:
        print("mode %s: step %.2f ms, exposed communication %.2f ms, %d buckets, peak gathered %d bytes, %d tensors "
              "in the state dict" % (m["mode"], 1e3 * m["step_time"], 1e3 * m["exposed_communication"], m["buckets"],
                                     m["peak_gathered_bytes"], len(state)))
        if m.get("trace"):
            print("trace:", m["trace"])
    model.close()


if __name__ == "__main__":
    main()
