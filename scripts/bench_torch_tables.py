"""The tables scripts/bench-torch.sh prints from its runs' output.

    bench_torch_tables.py medians OUT NP ROUNDS     all-reduce medians: gloo, torch-gorun, native
    bench_torch_tables.py boundary OUT NP ROUNDS    the Python/C boundary: native against torch-gorun
    bench_torch_tables.py ddp RUNS_FILE             the DDP step, gloo against gorun

OUT is bench-torch's output folder, NP the rank count, ROUNDS the number of
interleaved rounds whose files (LABEL.NP.ROUND.txt) are there.
"""
import re
import statistics
import sys

OUT_OF_PLACE, IN_PLACE = 5, 9  # the time columns (us) of the nccl-tests table


def times(path, cols):
    """size -> the least of the time columns cols (us), from an nccl-tests
    table (gorun bench, bench/torch_allreduce.py)."""
    t = {}
    for line in open(path):
        f = line.split()
        if line.startswith("#") or len(f) < 13 or not f[0].isdigit():
            continue
        t[int(f[0])] = min(float(f[c]) for c in cols)
    return t


def medians(out, np_, rounds):
    med = {}
    for lab in ("gloo", "torch-gorun", "native"):
        per = [times("%s/%s.%s.%d.txt" % (out, lab, np_, r), (OUT_OF_PLACE, IN_PLACE)) for r in range(1, rounds + 1)]
        med[lab] = {s: statistics.median(p[s] for p in per if s in p) for s in per[0]}
    print("# medians of %d rounds (us per call, the faster of out of place and in place); busbw ratios are time ratios"
          % rounds)
    print("# %10s  %10s  %12s  %10s  %16s  %18s" % ("size", "gloo", "torch-gorun", "native", "torch-gorun/gloo",
                                                      "torch-gorun/native"))
    for s in sorted(med["torch-gorun"]):
        g, t, n = med["gloo"].get(s), med["torch-gorun"][s], med["native"].get(s)
        print("  %10d  %10.1f  %12.1f  %10.1f  %16.2f  %18.2f" % (s, g or 0, t, n or 0, g / t if g else 0,
                                                                 n / t if n else 0))


def boundary(out, np_, rounds):
    farshare = {}  # (side+half, round) -> the share of placewatch's probes during the run that were far
    for line in open("%s/boundary.placement.%s.txt" % (out, np_)):
        f = line.split()  # side+half round probes N far F median-ns M
        farshare[(f[0], int(f[1]))] = int(f[5]) / max(1, int(f[3]))

    def place(half, r):  # "near", "far" or "mixed" for both runs of a half-round
        fs = [farshare[(side + half, r)] for side in ("native", "torch-gorun")]
        return "near" if max(fs) <= 0.25 else "far" if min(fs) >= 0.75 else "mixed"

    rows = {}  # size -> [(placement, native us, torch-gorun us)]
    for r in range(1, rounds + 1):
        for half in "ab":
            nat = times("%s/boundary.native%s.%s.%d.txt" % (out, half, np_, r), (IN_PLACE,))
            tor = times("%s/boundary.torch-gorun%s.%s.%d.txt" % (out, half, np_, r), (IN_PLACE,))
            for s in nat:
                rows.setdefault(s, []).append((place(half, r), nat[s], tor[s]))
    print("# us per call: medians of the rounds; native/torch-gorun is the busbw ratio (goal >= 0.9)")
    print("# placement: placewatch's probes during each run (near: both runs at most a quarter far; "
          "far: both at least three quarters); ratio medians per placement")
    print("# %10s  %10s  %12s  %18s  %22s  %-18s  %-18s  %s" % (
        "size", "native", "torch-gorun", "native/torch-gorun", "median of round ratios", "near: rounds, med",
        "far: rounds, med", "round ratios"))
    for s in sorted(rows):
        n = statistics.median(x[1] for x in rows[s])
        t = statistics.median(x[2] for x in rows[s])
        rs = [x[1] / x[2] for x in rows[s]]
        by = []
        for pl in ("near", "far"):
            q = [x[1] / x[2] for x in rows[s] if x[0] == pl]
            by.append("%2d, %.2f" % (len(q), statistics.median(q)) if q else " 0, -")
        print("  %10d  %10.1f  %12.1f  %18.2f  %22.2f  %-18s  %-18s  %s" % (
            s, n, t, n / t, statistics.median(rs), by[0], by[1], " ".join("%.2f" % x for x in rs)))


def ddp(runs_file):
    runs = {}
    for line in open(runs_file):
        m = re.match(r"backend (\w+) ranks (\d+): median step ([\d.]+) ms, cpu ([\d.]+) ms", line)
        if m:
            runs.setdefault((int(m[2]), m[1]), []).append((float(m[3]), float(m[4])))
    print("# %5s  %-24s  %-24s  %s" % ("ranks", "gloo step ms (cpu/rank)", "gorun step ms (cpu/rank)",
                                       "gloo/gorun step (>1: gorun faster)"))
    for np_ in sorted({k[0] for k in runs}):
        med = {}
        for b in ("gloo", "gorun"):
            r = runs.get((np_, b), [])
            med[b] = (statistics.median(x[0] for x in r), statistics.median(x[1] for x in r)) if r else (float("nan"),) * 2
        print("  %5d  %8.1f (%6.1f)         %8.1f (%6.1f)         %.2f   (all: gloo %s | gorun %s)" % (
            np_, *med["gloo"], *med["gorun"], med["gloo"][0] / med["gorun"][0],
            " ".join("%.0f" % x[0] for x in runs.get((np_, "gloo"), [])),
            " ".join("%.0f" % x[0] for x in runs.get((np_, "gorun"), []))))


def main(argv):
    if len(argv) == 5 and argv[1] in ("medians", "boundary"):
        {"medians": medians, "boundary": boundary}[argv[1]](argv[2], argv[3], int(argv[4]))
    elif len(argv) == 3 and argv[1] == "ddp":
        ddp(argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
