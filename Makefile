# gorun — `make help` lists the targets.
GO        ?= go
BIN       := bin
GOFLAGS   ?=
TEST_TIMEOUT ?= 25m
# The project's Python: a venv with torch 2.x (scripts/install-torch.sh makes it).
GORUN_VENV ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/gorun/venv
export GORUN_VENV
PYTHON    ?= $(GORUN_VENV)/bin/python

.PHONY: help build lib venv python uninstall-python test-python test-torch-suite bench-torch test test-deps vet unit test-desync test-overload bench-launch bench-restart bench-detect bench-elastic bench-restart-trainer bench-compare bench-latency bench-recorder bench-multihost bench-mpi bench-gpu bench-gpu-standin clean

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

# The commit gorun --version names, with -modified for uncommitted changes
# (Go's own VCS stamp is off under GOFLAGS=-buildvcs=false).
COMMIT    := $(shell git rev-parse --short=12 HEAD 2>/dev/null)$(shell git diff --quiet HEAD 2>/dev/null || echo -modified)

build: ## build gorun and the example programs into bin/
	@mkdir -p $(BIN)
	$(GO) build -ldflags "-X main.commit=$(COMMIT)" -o $(BIN)/ ./cmd/... ./examples/...

lib: ## build the C ABI: bin/libgorun.so and its header bin/gorun.h (needs cgo and gcc)
	@mkdir -p $(BIN)
	CGO_ENABLED=1 $(GO) build -buildmode=c-shared -o $(BIN)/libgorun.so ./libgorun
	@rm -f $(BIN)/libgorun.h   # cgo's own header; gorun.h is the documented one
	cp libgorun/gorun.h $(BIN)/gorun.h

venv: ## the project's Python venv ($(GORUN_VENV)): torch 2.15.0, pytest, numpy; a no-op when it is there
	@bash scripts/install-torch.sh >/dev/null

python: lib venv ## pip-install the torch backend (editable, python/) into $(PYTHON) with libgorun.so copied into it
	cp $(BIN)/libgorun.so python/gorun/libgorun.so
	@PYTHON=$(PYTHON) bash scripts/install-python.sh

uninstall-python: ## undo make python: pip-uninstall gorun from $(PYTHON) (if it is this checkout's) and remove python/gorun/libgorun.so
	@PYTHON=$(PYTHON) bash scripts/install-python.sh --uninstall

test: test-deps build vet ## everything CI runs: install test deps, build, vet, all tests with -race, the torch suite
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...
	GORUN_OVERLOAD_SECS=8 $(GO) test -race -count=1 -run TestNoFalseFreezeUnderLoad ./launcher
	@$(MAKE) --no-print-directory test-python

test-python: build lib ## the torch backend's pytest suite (torch 2.x from $(PYTHON)) under gorun on 1-4 ranks
	@if ! $(PYTHON) -c 'import torch, pytest' 2>/dev/null; then \
	  echo "test-python: $(PYTHON) lacks torch or pytest: run make venv (make test does)"; exit 1; \
	else d=$$(mktemp -d); PYTHONWARNINGS=ignore $(PYTHON) -m pytest -q -p no:cacheprovider --basetemp=$$d python/tests; \
	  rc=$$?; rm -rf $$d; exit $$rc; fi

# The whole suite takes about 8 minutes on 2 cores (shards of forked ranks): world sizes 2 and 3,
# then at 8 the subgroup tests torch skips below 8 ranks.
# SUITE_MD=FILE writes every test's result per backend there (notes/torch2-suite-results.md
# is such a file); gorun@gloo is gorun run past the suite's gloo-only name gates (a diagnosis,
# not gorun's count).
SUITE_JOBS ?= 2
test-torch-suite: build lib venv ## torch's own distributed suite (DistributedTest._DistTestBase, all of it) on gloo, gorun and gorun past gloo's name gates, world sizes 2 and 3 (and 8 for the subgroup tests): counts, every test gloo passes and gorun does not, with the reason; fails unless those are exactly scripts/torch-suite-gaps.tsv (K=regex selects, SUITE_MD=file writes the table)
	GORUN_LIB=$(CURDIR)/$(BIN)/libgorun.so PYTHONPATH=$(CURDIR)/python OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore \
	  $(PYTHON) python/tests/torch_suite.py --compare gloo,gorun,gorun@gloo --world-sizes 2,3 --large-world 8 --jobs $(SUITE_JOBS) \
	  --gaps scripts/torch-suite-gaps.tsv $(if $(K),-k '$(K)') $(if $(SUITE_MD),--markdown '$(SUITE_MD)')

test-deps: ## install what the tests need (Debian packages as root, the Python venv); a no-op when present
	@bash scripts/install-test-deps.sh
	@bash scripts/install-torch.sh >/dev/null

vet: ## go vet and a gofmt check
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

unit: ## fast tests only (no -race, short mode)
	$(GO) test -short -count=1 ./...

test-desync: ## the full desync split matrix: np 2-8, every k, 6 collective/point-to-point splits + a Send/Recv size mismatch x 2 sizes x shm/tcp (784 cases, ~45 s), and the check's cost at 64 ranks
	GORUN_DESYNC_MATRIX=full $(GO) test -count=1 -run 'TestSplitMatrix|TestCheckCostAt64' -v ./comm

.PHONY: test-chaos bench-netfault bench-linklease
test-chaos: ## the full chaos matrix: fault kinds x phases x launch modes (gorun, direct, namespace hosts as root), invariants checked after every row, printed as a table (~4 min)
	@rm -f /tmp/gorun-chaos-table.txt
	GORUN_CHAOS=full GORUN_CHAOS_TABLE=/tmp/gorun-chaos-table.txt $(GO) test -count=1 -timeout 20m -run TestChaosMatrix ./tests/chaos; \
		rc=$$?; cat /tmp/gorun-chaos-table.txt 2>/dev/null; rm -f /tmp/gorun-chaos-table.txt; exit $$rc
	GORUN_CHAOS=full $(GO) test -count=1 -timeout 10m -run TestElasticGrowBack ./tests/multihost

bench-netfault: ## 8-byte all-reduce latency with the data-plane fault hook compiled out, compiled in, and armed (medians, ratios)
	flock /tmp/gorun-bench.lock scripts/bench-netfault.sh

bench-linklease: ## 8-byte all-reduce latency over TCP: before the link lease, lease off, lease on (interleaved rounds, medians, ratios)
	flock /tmp/gorun-bench.lock scripts/bench-linklease.sh

test-overload: ## no false freeze detection: 32 ranks all-reduce beside a CPU hog per core for 60 s (make test runs 8 s)
	GORUN_OVERLOAD_NP=32 GORUN_OVERLOAD_SECS=60 $(GO) test -count=1 -run TestNoFalseFreezeUnderLoad -v ./launcher

bench-restart: build ## kill-and-restart: gorun --max-restarts vs torchrun --max_restarts on one torch gloo program, kill -> first step of the new world
	flock /tmp/gorun-bench.lock scripts/bench-restart.sh

bench-detect: build ## the fault-detection promises: SIGKILL / SIGSTOP of a rank mid all-reduce -> every survivor's error, under gorun (host leaders, flat), without gorun, across namespace hosts (root)
	flock /tmp/gorun-bench.lock scripts/bench-detect.sh

bench-elastic: build ## the elastic-restart figures from --report: a rank frozen before it joined (detect, recover), grow-back across 2 namespace hosts (root)
	flock /tmp/gorun-bench.lock scripts/bench-elastic.sh

bench-restart-trainer: build ## restart time of the Go trainer, kill -> first step of the new world: one host, 4 namespace hosts (root), and a kill-host with a spare host taking over
	flock /tmp/gorun-bench.lock scripts/bench-restart-trainer.sh

bench-launch: build ## launch time: gorun -np 16 /bin/true vs mpirun, side by side
	@bash scripts/bench-launch.sh

bench-torch: build lib ## torch all-reduce busbw: backend gorun vs gloo vs native gorun bench, 2 and 4 ranks, ratios; DDP step
	@bash scripts/bench-torch.sh

bench-compare: build ## all-reduce busbw: gorun (tcp, shm) vs Open MPI and torch gloo, ratios + PNG in bench-results/
	@bash scripts/bench-compare.sh

bench-latency: build ## small/mid collectives: gorun vs Open MPI on shm (vader) and tcp (btl tcp), 2 and 4 ranks, quiet and under a CPU hog per core, medians, each side's hog/quiet ratio
	@bash scripts/bench-latency.sh

bench-recorder: ## flight recorder cost: 8 B all-reduce between 2 processes, recorder on vs off in alternating blocks of one run (shm, tcp), 3 runs, medians; then the recorder alone per call against the previous mutex design (anchor)
	for i in 1 2 3; do GORUN_DESYNC_BENCH=1 $(GO) test -count=1 -run TestRecorderCost -v ./comm | grep '8 B all-reduce'; done
	$(GO) test -run XXX -bench BenchmarkFlightRecorder -count 5 ./comm | grep Benchmark

bench-multihost: build ## multi-host launch: gorun vs mpirun --hostfile over 4 namespace hosts with sshd (root)
	@bash scripts/bench-multihost.sh

bench-mpi: build ## MPICH MPI_Init+Barrier: gorun vs mpiexec.hydra (and an ideal launcher locally), 16 ranks locally and 4 namespace hosts x 4 (root)
	@bash scripts/bench-mpi.sh

bench-gpu: ## GPU all-reduce: gorun --device cuda vs torch.distributed NCCL, side by side (needs a GPU and CUDA torch; not yet run on one)
	@bash scripts/bench-gpu.sh

bench-gpu-standin: ## the bench-gpu pipeline without a GPU: stand-in NCCL vs torch gloo (checks the script, measures nothing)
	@bash scripts/bench-gpu.sh --standin bench-results/gpu-standin

# ---- planner (stepgraph passes, gorun_plan) ----
.PHONY: bench-plan bench-rdzvscale
bench-plan: ## gorun plan on ~10k/30k/100k-node steps, default and all four passes, medians of wall and CPU time (ANCHOR=REV runs that revision side by side; RUNS, SIZES)
	@bash scripts/bench-plan.sh

bench-rdzvscale: ## in-process host-leader formation at 64, 256, 1,024 and 4,096 ranks (16 per host): medians of wall and CPU time, load average, peak memory (ANCHOR=REV runs that revision interleaved; SIZES, ROUNDS, PER)
	flock /tmp/gorun-bench.lock scripts/bench-rdzvscale.sh

.PHONY: bench-launchmem
bench-launchmem: ## launcher memory per rank: gorun's (launcher + local supervisor) resident KB beside Open MPI's mpirun and MPICH's hydra at SIZES ranks (64,256,1024) of sleep, medians of ROUNDS, and the slope in KB per rank
	flock /tmp/gorun-bench.lock scripts/bench-launchmem.sh

.PHONY: bench-outputpath
bench-outputpath: ## the output path's cost, this tree beside gorun built from BASE (main), mpirun and hydra: 100 MB through one rank's stdout, a line's latency, -np 2 start-up; medians of ROUNDS
	flock /tmp/gorun-bench.lock scripts/bench-outputpath.sh

.PHONY: bench-pmiscale
bench-pmiscale: ## a real MPICH program's PMI start-up over HOSTS×PER simulated hosts (32×4): gets that reach gorun and bytes it sends, batched answers vs one key per answer
	flock /tmp/gorun-bench.lock scripts/bench-pmiscale.sh

# The scale simulation (sim/, bench/simscale).
.PHONY: sim-scale
sim-scale: ## the scale MODEL: costs measured from the real code here, two calibrations (real in-process runs, and as root real gorun jobs over namespace hosts, each beside the model), the 1,000×8 table against the targets (HOSTS, PER, ROUNDS, CALIBRATE, NETNS_SHAPES, NETNS=0 skips the hosts; COSTS_OUT=FILE keeps the costs)
	flock /tmp/gorun-bench.lock scripts/sim-scale.sh

clean: uninstall-python ## remove build outputs (and what make python installed)
	rm -rf $(BIN)

.PHONY: bench-fx
bench-fx: build lib ## gorun's passes vs Inductor's on the same traced SimpleFSDP GPT joint graphs: collectives, exposed comm (each side's model), step time over gloo at 2 and 4 ranks, peak memory, bitwise numerics (one table)
	flock /tmp/gorun-bench.lock env PYTHONWARNINGS=ignore TORCH_CPP_LOG_LEVEL=ERROR $(PYTHON) scripts/bench_fx.py $(BENCH_FX_ARGS) 2>&1 | grep -v '^\[rank[0-9]*\]:\|No accelerator\|UserWarning\|register()'

# gorun.torch (the step runtime for PyTorch training)
.PHONY: bench-torch-step
bench-torch-step: build lib ## gorun.torch step on CPU, 2 and 4 ranks: ddp vs torch DDP, fsdp vs torch FSDP2 (gloo), paired rotated rounds, medians, peak gathered bytes, Perfetto trace
	flock /tmp/gorun-bench.lock scripts/bench-torch-step.sh

.PHONY: bench-fusion
bench-fusion: build ## fusion on the fly, native: 64 x 1 KiB all-reduces (async, issued for one wait, one coalesced call) vs one 64 KiB, and a lone 8 B all-reduce, this checkout vs BEFORE (default main), medians, ratios
	flock /tmp/gorun-bench.lock scripts/bench-fusion.sh

# Supervision and verdicts: watchers killed together, no false verdicts under load.
.PHONY: test-watchers
test-watchers: ## gorun, supervisor and host agent SIGKILLed in every pair and triple (and pkill -f), locally and across namespace hosts (root), ranks that fork/setsid/clear env, 50 runs a row: survivors and leftover cgroups (~10 min)
	@rm -f /tmp/gorun-watchers-table.txt
	GORUN_WATCHERS_RUNS=$${GORUN_WATCHERS_RUNS:-50} GORUN_WATCHERS_TABLE=/tmp/gorun-watchers-table.txt $(GO) test -count=1 -timeout 60m -run TestKillWatchers ./tests/chaos; \
		rc=$$?; cat /tmp/gorun-watchers-table.txt 2>/dev/null; rm -f /tmp/gorun-watchers-table.txt; exit $$rc

.PHONY: soak-verdicts
soak-verdicts: build lib ## no false frozen/lost verdict in 10 min at load >= 40 on 2 cores (40 CPU hogs, a memory churner): trainer 4-16 ranks, torch DDP, MPICH; SIGSTOP/SIGKILL probes named within 10 s / 2 s (SOAK_SECS to change)
	flock /tmp/gorun-bench.lock bash scripts/soak-verdicts.sh

# Fault-tolerant training (package ft, gorun --fault-tolerant)
.PHONY: bench-ft
bench-ft: build ## fault-tolerant dp vs --max-restarts from a checkpoint, Go trainer, 4 ranks, the same kills: total time to N steps, steps lost, kill -> training again, medians of 5
	flock /tmp/gorun-bench.lock python3 scripts/bench_ft_go.py bin/gorun bin/trainer $(BENCH_FT_ARGS)

.PHONY: bench-ft-hosts
bench-ft-hosts: build lib ## a lost host's ranks taken over by a spare host, 4 namespace hosts (root), Go trainer: --fault-tolerant vs --max-restarts from a checkpoint, the replacement's join after its start and kill -> training again, medians of 5 (BENCH_FT_HOSTS_ARGS)
	flock /tmp/gorun-bench.lock python3 scripts/bench_ft_hosts.py bin/gorun bin/trainer $(BENCH_FT_HOSTS_ARGS)

# Fault-tolerant torch training: gorun.ft vs torchft 0.2.0 vs --max-restarts from a checkpoint
.PHONY: venv-torchft bench-ft-torch soak-ft-torch
venv-torchft: venv ## add torchft 0.2.0 (the fault-tolerance anchor) to $(GORUN_VENV), keeping its torch; a no-op when it is there
	@bash scripts/install-torchft.sh >/dev/null

bench-ft-torch: build lib venv-torchft ## fault-tolerant torch GPT, 3 replicas, 2 kills: gorun --fault-tolerant (with and without its fork server) vs torchft 0.2.0 (gloo) vs --max-restarts from a checkpoint; total time, steps lost, time to heal, the replacement's timeline; medians, ratios (BENCH_FT_TORCH_ARGS)
	flock /tmp/gorun-bench.lock env PYTHONWARNINGS=ignore GORUN_LIB=$(CURDIR)/$(BIN)/libgorun.so $(PYTHON) bench/ft/run.py $(BENCH_FT_TORCH_ARGS)

soak-ft-torch: build lib venv ## random kills (--inject random:mtbf) of a fault-tolerant torch GPT on 3 replicas for ~10 min: every heal bitwise equal, one final digest, no lost committed step, no orphans (SOAK_FT_TORCH_ARGS)
	flock /tmp/gorun-bench.lock env PYTHONWARNINGS=ignore GORUN_LIB=$(CURDIR)/$(BIN)/libgorun.so $(PYTHON) bench/ft/soak.py $(or $(SOAK_FT_TORCH_ARGS),--duration 600 --mtbf 30s)
