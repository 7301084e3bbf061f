# One install path for a fresh machine: `make demo` and `make test` install whatever is missing first.
#   TF_SPEC     the TensorFlow requirement (GPU machines: TF_SPEC='tensorflow[and-cuda]==2.21.0')
#   PYTHON      the interpreter used to create .venv
PYTHON ?= python3
TF_SPEC ?= tensorflow-cpu==2.21.0
# Keras 2 (tf-keras), only for the benchmark's comparison with Horovod's own Keras integration.
TF_KERAS_SPEC ?= tf-keras==2.21.0
# ml_dtypes (TensorFlow asks for >=0.5.1,<1): 0.7.0 takes about 0.6 s of CPU to import, 0.6.0 0.05 s, and
# every TensorFlow process of the suite imports it (2026-12-07: python -c "import ml_dtypes", 0.87 s against
# 0.21 s; import tensorflow, keras: 4.8 s against 4.3 s, the mean of three each).
ML_DTYPES_SPEC ?= ml_dtypes==0.6.0
# torch, only for its torchrun launcher in the launcher tests (the `torch` extra): the CPU build.
TORCH_SPEC ?= torch==2.13.0
# Ray Train for hvdkeras.ray and its tests (the `ray` extra), at the version the tests ran with.
RAY_SPEC ?= ray[train]==2.60.0
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.hvdkeras-installed
PYTEST_ARGS ?=
# lab/ (netlab: the test hosts and Slurm) on a venv's path, for the multi-worker tests and the benchmarks.
LAB_PTH = -c "import site, sys; open(site.getsitepackages()[0] + '/hvdkeras-lab.pth', 'w').write(sys.argv[1] + '\n')" "$(CURDIR)/lab"
NETBENCH_ARGS ?=

.PHONY: install lab test test-fast demo bench netbench stallbench batchbench shardbench balancebench xlabench loopbench slowbench killtrials horovod-examples gpu-build lint clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml scripts/install_horovod.sh Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet "$(TF_SPEC)" "keras>=3.0,<4" numpy "$(ML_DTYPES_SPEC)"
	bash scripts/install_horovod.sh $(PY)
	$(PY) -m pip install --quiet "$(TORCH_SPEC)" "$(RAY_SPEC)"
	$(PY) -m pip install --quiet -e ".[test,dev,torch,spark,ray]"
	$(PY) -m pip install --quiet --no-deps "$(TF_KERAS_SPEC)"
	$(PY) $(LAB_PTH)
	$(VENV)/bin/horovodrun --check-build
	touch $(STAMP)

# Two pytest workers: every multi-worker test runs on one of them, in order (see tests/conftest.py); the
# single-process tests fill the other core meanwhile.
test: install lab
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -n 2 $(PYTEST_ARGS)

# The test lab's system packages (Slurm, munge, OpenMPI, sshd), installed when root and missing.
lab:
	bash scripts/install_lab.sh

test-fast: install
	$(PY) -m pytest -m "not multiworker" $(PYTEST_ARGS)

# TensorFlow's C++ start-up lines are left out (hvdkeras/cli/startup_log.py); `make demo HVDKERAS_TF_STARTUP_LOG=1`
# keeps them. TF_CPP_MIN_LOG_LEVEL is 2 unless set. DEMO_ARGS: more arguments for examples/keras_digits.py
# (--epochs, --out-dir, ...).
DEMO_ARGS ?=
demo: install
	bash -o pipefail -c 'TF_CPP_MIN_LOG_LEVEL=$${TF_CPP_MIN_LOG_LEVEL:-2} $(VENV)/bin/horovodrun -np 2 -H localhost:2 --gloo \
	  $(PY) examples/keras_digits.py $(DEMO_ARGS) 2>&1 | $(PY) -m hvdkeras.cli.startup_log'

bench: install
	$(PY) benchmarks/run_benchmarks.py

# Rank 0 SIGKILLed while ModelCheckpoint, BackupAndRestore and model.save write, 20 times each; writes
# docs/kill_trials.json and exits 1 if anything was lost.
killtrials: install
	$(PY) benchmarks/kill_trials.py --trials 20 --out docs

# Two test hosts over a shaped link (needs root, ip and tc); writes docs/network_benchmark.{json,png}, then
# one step at 500 and at 200 Mbit/s, bucket by bucket, to docs/step_timeline.{json,png}.
netbench: install lab
	$(PY) benchmarks/network_benchmark.py $(NETBENCH_ARGS)
	$(PY) benchmarks/step_timeline.py --out docs

# Step-time percentiles and slow runs on the two test hosts at 100 Mbit/s, quiet and with 1 and 2 competing
# CPU-bound processes, with and without Horovod's threads at nice -15 (needs root); docs/stall_benchmark.json.
stallbench: install lab
	$(PY) benchmarks/stall_benchmark.py --out docs

# Unmodified scripts under both batch conventions against one process (the corpus and the digits example);
# writes docs/batch_convention.json.
batchbench: install
	$(PY) benchmarks/batch_convention.py --out docs

# Sharded optimizer state against unsharded, N = 1, 2, 4, under a per-worker memory cgroup, and on the two
# test hosts at 200 Mbit/s (needs root); writes docs/sharding_benchmark.{json,png}.
shardbench: install lab
	$(PY) benchmarks/sharding_benchmark.py --out docs --hosts 200mbit

# ZeRO's balance: the largest worker's share of the optimizer state, variables cut into pieces against owned
# whole and against unsharded, on an MLP with a dominant kernel and a model with a 30% embedding, N = 2 and 4,
# and the step time of each way, the ways taking turns in one job per configuration (about 17 minutes here);
# writes docs/sharding_balance.json.
balancebench: install
	$(PY) benchmarks/balance_benchmark.py --out docs

# XLA kept for the forward and backward pass against XLA off: an MLP, a convnet and a small transformer, one
# process, two workers here and on the two test hosts (needs root); writes docs/xla_benchmark.{json,png}.
xlabench: install lab
	$(PY) benchmarks/xla_benchmark.py --out docs

# Custom training loops against fit: a tf.function tape loop (hvdkeras's DistributedGradientTape, and unmodified under
# `hvdkeras run`'s patch) against fit with DistributedOptimizer and Horovod's own tape loop (Keras 3, tf-keras), two
# workers here and on the two test hosts at 200 Mbit/s (needs root); writes docs/loop_benchmark.json.
loopbench: install lab
	$(PY) benchmarks/loop_benchmark.py --out docs

# Time to accuracy on the two test hosts at 50 and 10 Mbit/s (needs root): the exact allreduce, fp16, PowerSGD at
# ranks 1 and 4, post-local SGD and DiLoCo at two periods each; writes docs/slowlink_benchmark.{json,png}.
slowbench: install lab
	$(PY) benchmarks/slowlink_benchmark.py --out docs

# Horovod's own TF2 examples (its MNIST and synthetic-benchmark scripts), their one import line changed, on 2 workers
# by horovodrun and by `hvdkeras run`: each trains one model. HOROVOD_EXAMPLES is the examples/tensorflow2 folder
# of a checkout of Horovod's repository (the examples are not in its package). Not part of `make test`.
HOROVOD_EXAMPLES ?=
EXAMPLES_OUT ?= /tmp/hvdkeras-horovod-examples

horovod-examples: install
	@test -n "$(HOROVOD_EXAMPLES)" || { echo "set HOROVOD_EXAMPLES to Horovod's examples/tensorflow2 folder"; exit 2; }
	$(PY) scripts/horovod_examples.py $(HOROVOD_EXAMPLES) $(EXAMPLES_OUT)

# Horovod with NCCL for the GPU TensorFlow, built and checked on a machine without a GPU, in a fresh venv of its
# own (not part of `make test`): tensorflow[and-cuda], a CUDA 12.4 toolkit made in the venv from Debian's
# packages (scripts/cuda_toolkit.py: TensorFlow's CUDA wheels hold no nvcc), Horovod built with
# HOROVOD_GPU_OPERATIONS=NCCL; then its checks, the 2-worker demo and the scenarios launch, on CPU over Gloo.
GPU_VENV := .venv-gpu
GPU_PY := $(GPU_VENV)/bin/python
GPU_TF_SPEC ?= tensorflow[and-cuda]==2.21.0
# The Debian archive for the toolkit's packages; left empty, each archive of the machine's apt sources in turn.
CUDA_DEB_ARCHIVE ?=
SCENARIO_MODULES = $(shell grep -l '^SCENARIOS' tests/multiworker/test_*.py)

gpu-build: lab
	rm -rf $(GPU_VENV)
	$(PYTHON) -m venv $(GPU_VENV)
	$(GPU_PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(GPU_PY) -m pip install --quiet "$(GPU_TF_SPEC)" "keras>=3.0,<4" numpy
	cuda_home=$$($(GPU_PY) scripts/cuda_toolkit.py $(GPU_PY) $(if $(CUDA_DEB_ARCHIVE),--archive $(CUDA_DEB_ARCHIVE))) && CUDA_HOME=$$cuda_home bash scripts/install_horovod.sh $(GPU_PY)
	$(GPU_PY) -m pip install --quiet -e ".[test]"
	$(GPU_PY) $(LAB_PTH)
	$(GPU_VENV)/bin/horovodrun --check-build | tee $(GPU_VENV)/check-build.txt
	grep -q '\[X\] NCCL' $(GPU_VENV)/check-build.txt
	$(GPU_VENV)/bin/hvdkeras check | tee $(GPU_VENV)/hvdkeras-check.txt
	grep -q 'NCCL \[X\]' $(GPU_VENV)/hvdkeras-check.txt && grep -q '^GPUs visible: 0' $(GPU_VENV)/hvdkeras-check.txt
	TF_CPP_MIN_LOG_LEVEL=2 $(GPU_VENV)/bin/horovodrun -np 2 -H localhost:2 --gloo $(GPU_PY) examples/keras_digits.py
	$(GPU_PY) -m pytest -p no:cacheprovider $(SCENARIO_MODULES)

# ruff, then the package's layers (the import-linter contracts in setup.cfg).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache

clean:
	rm -rf $(VENV) $(GPU_VENV) build *.egg-info .pytest_cache
