"""bench-fx: gorun's passes and Inductor's, side by side on the same joint
graphs (a SimpleFSDP GPT's training step traced with make_fx), run eagerly
over gloo on CPU.

One line per graph, rank count and side:
  colls      collectives the rewritten graph issues (all-gather/reduce-scatter)
  exposed    exposed communication by the side's own estimate: gorun's cost
             model (gorun_plan priced by gorun.fx.calibrate_comm: latency,
             bus and copy bandwidth measured on the same gloo group first,
             the default; "@defaults": gorun_plan's built-in constants),
             Inductor's overlap scheduler's analytical model; "-" where the
             side has no model
  step ms    measured step time, median over rounds of the slowest rank;
             sides interleaved round by round
  x anchor   step time / the unbucketed graph's (same run)
  peak KiB   measured: most bytes of tensor storage the step held at once
             (inputs excluded), walking the graph and freeing at last use
  equal      every output bitwise equal to the unbucketed graph's, on every rank
             ("bound": not, but every output that differs is a weight
             gradient's update within the bound of summing it in another
             order, fxrank.reorder_bound; the rest bitwise equal)

  diff       largest |output - unbucketed eager output|

  chunk sides: "gorun chunk ..." split every block in two along the batch
             (forward only: bitwise equal; backward: equal but for the
             weight gradients' summation order, see notes/fx-passes.md)

    python3 scripts/bench_fx.py [--worlds 2,4] [--rounds 15] [--chunk 0] [--compile aot_eager,inductor]
"""

import argparse
import os
import sys
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "python", "tests")]

import fxrank  # noqa: E402
import gorun.fx as gfx  # noqa: E402

GRAPHS = {
    "gpt-4L-d64": {"vocab": 128, "d": 64, "heads": 4, "layers": 4},
    "gpt-6L-d128": {"vocab": 256, "d": 128, "heads": 4, "layers": 6},
    # torchtitan 0.3.0's llama3 debugmodel, 2 blocks, causal SDPA in place of
    # its flex attention (fxrank.torchtitan_llama3); only on request
    # (--graphs tt-llama3-2L), with torchtitan installed in the venv
    "tt-llama3-2L": {"kind": "torchtitan-llama3", "layers": 2},
}
DEFAULT_GRAPHS = "gpt-4L-d64,gpt-6L-d128"
GORUN = [("gorun order only", ""), ("gorun blocks,overlap", "blocks,overlap"),
         ("gorun reshard,blocks,overlap", "reshard,blocks,overlap")]
# Chunked sides: every block split in two along the batch (chunk_always: the
# split is made whatever the cost model says, so it is measured), forward
# only (bitwise equal) and backward with per-chunk reduce-scatters (the
# overlap the pass is for; weight gradients summed in another order).
CHUNK = {"chunk_regions": "layers.*", "chunk_always": True}
GORUN_CHUNK = [("gorun chunk fwd", "chunk", dict(CHUNK, chunk_dirs="forward")),
               ("gorun chunk bwd", "chunk", dict(CHUNK, chunk_dirs="backward", chunk_accumulate=False)),
               ("gorun chunk bwd,blocks,overlap", "chunk,blocks,overlap",
                dict(CHUNK, chunk_dirs="backward", chunk_accumulate=False)),
               # the pass's own choice: a segment is split only where the
               # cost model says it hides more
               ("gorun chunk?,blocks,overlap", "chunk,blocks,overlap", {"chunk_regions": "layers.*"})]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--graphs", default=DEFAULT_GRAPHS, help="of %s" % ", ".join(GRAPHS))
    ap.add_argument("--chunk", type=int, default=1, help="add the chunked sides (0: leave them out)")
    ap.add_argument("--compile", default="", help="torch.compile backends to add sides for (aot_eager,inductor)")
    a = ap.parse_args()
    rows, measured = [], {}
    for gname in a.graphs.split(","):
        for world in [int(w) for w in a.worlds.split(",")]:
            spec = {"model": GRAPHS[gname], "repeats": a.rounds, "batch": 4, "seq": 32}
            t0 = time.time()
            if world not in measured:
                measured[world] = fxrank.run_ranks(world, {"calibrate": True})
                print("# %d ranks, calibrate_comm on gloo: latency %.0f us, busbw %.2f GB/s, copy %.2f GB/s" % (
                    world, measured[world]["latency_ns"] / 1e3, measured[world]["bus_bandwidth"] / 1e9,
                    measured[world]["copy_bandwidth"] / 1e9), file=sys.stderr)
            joint, costs, step = fxrank.prepare(spec, world, chunks=2 if a.chunk else None)
            sides = [{"name": "unbucketed (anchor)", "kind": "unbucketed"}]
            for name, passes in GORUN:
                for model, comm in (("", measured[world]), (" @defaults", False)):
                    if passes == "" and model:
                        continue
                    planned, summary = gfx.plan(step, passes, comm=comm)
                    sides.append({"name": name + model, "kind": "gorun", "planned": planned,
                                  "exposed_ns": summary["estimate"]["After"]["exposed_ns"]})
            blocks = "m.layers.*" if GRAPHS[gname].get("kind") == "torchtitan-llama3" else "layers.*"
            for name, passes, opts in GORUN_CHUNK if a.chunk else ():
                planned, summary = gfx.plan(step, passes, comm=measured[world], **dict(opts, chunk_regions=blocks))
                sides.append({"name": name, "kind": "gorun", "planned": planned, "bound": True,
                              "exposed_ns": summary["estimate"]["After"]["exposed_ns"]})
            for backend in [b for b in a.compile.split(",") if b]:
                # torch.compile of the unbucketed graph and of gorun's
                # calibrated blocks,overlap plan; "equal" then compares the
                # two compiled graphs (a compiler may round differently from eager)
                k = len(sides)
                sides.append({"name": "unbucketed compiled:" + backend, "kind": "unbucketed", "compile": backend})
                planned, summary = gfx.plan(step, "blocks,overlap", comm=measured[world])
                sides.append({"name": "gorun blocks,overlap compiled:" + backend, "kind": "gorun", "planned": planned,
                              "compile": backend, "equal_to": k,
                              "exposed_ns": summary["estimate"]["After"]["exposed_ns"]})
            sides.append({"name": "inductor bucketing", "kind": "inductor-bucketing"})
            sides.append({"name": "inductor overlap+bucketing", "kind": "inductor-overlap", "costs": costs})
            spec["sides"] = sides
            r = fxrank.run_ranks(world, spec, timeout=900)
            print("# %s, %d ranks: traced and run in %.0f s; joint graph = autograd on the unsharded model: %s"
                  % (gname, world, time.time() - t0, "yes" if r["reference_ok"] else "NO"), file=sys.stderr)
            rows.append((gname, world, r))
    print("%-12s %5s  %-44s %9s %11s %8s %8s %9s %6s %8s" % ("graph", "ranks", "side", "colls", "exposed us",
                                                             "step ms", "x anchor", "peak KiB", "equal", "diff"))
    verdicts = []
    for gname, world, r in rows:
        anchor = r["sides"][0]["step_s"]
        for s in r["sides"]:
            c = s["collectives"]
            e = "-" if s["exposed_ns"] is None else "%.1f" % (s["exposed_ns"] / 1e3)
            print("%-12s %5d  %-44s %4d/%-4d %11s %8.1f %8.2f %9s %6s %8.1e" % (
                gname, world, s["name"], c.get("all_gather", 0), c.get("reduce_scatter", 0), e,
                s["step_s"] * 1e3, s["step_s"] / anchor, "%.0f" % (s["peak_bytes"] / 1024) if s["peak_bytes"] else "-",
                "yes" if s["equal"] else "bound" if s.get("within_bound") else "NO", s["max_abs_diff"]))
        g = [s for s in r["sides"] if s["name"].startswith("gorun") and "compiled" not in s["name"]
             and s["equal"]]  # a side that is not bitwise equal does not compete
        i = [s for s in r["sides"] if s["name"].startswith("inductor")]
        for what, key in (("step time", "step_s"), ("peak memory", "peak_bytes")):
            bg, bi = min(g, key=lambda s: s[key]), min(i, key=lambda s: s[key])
            win = "gorun" if bg[key] <= bi[key] else "INDUCTOR"
            verdicts.append("%s, %d ranks, %s: %s wins (best gorun: %s %s; best inductor: %s %s)" % (
                gname, world, what, win, bg["name"], _fmt(key, bg[key]), bi["name"], _fmt(key, bi[key])))
    print()
    for v in verdicts:
        print(v)
    print("\n(medians of %d interleaved rounds on a shared machine: step times are noisy)" % a.rounds)


def _fmt(key, v):
    return "%.1f ms" % (v * 1e3) if key == "step_s" else "%.0f KiB" % (v / 1024)


if __name__ == "__main__":
    main()
