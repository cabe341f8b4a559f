# Two commands set everything up on a fresh machine:
#   make demo   - venv + install, build shards from the bundled COCO sample, print their stats
#   make test   - venv + install, run the test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SHARED ?= ../shared
COCO ?= $(SHARED)/data/coco-mini
DEMO ?= demo_out
AUDIO_PROFILE ?= qwen2.5-omni
PYTEST_ARGS ?=
GPU_PYTHON ?= python3  # the CUDA node's own interpreter (torch already there)

.PHONY: setup demo test test-fast lint docs gpu-wheels gpu-check clean

setup: $(VENV)/.installed

# torch is pinned and installed first so the CPU build on the machine is used (GPU users get CUDA wheels).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,s3,ray]'  # s3, ray: their tests run in CI
	$(PY) -m packer.encode.tokenizers
	touch $@

demo: setup
	$(PY) scripts/coco_to_jsonl.py --coco $(COCO) --out $(DEMO)/jsonl --videos 8 --audio 8
	$(VENV)/bin/packer build $(DEMO)/jsonl/coco_caption_trees.jsonl --output $(DEMO)/caption_trees \
		--config configs/coco-caption-trees.yaml --overwrite
	$(VENV)/bin/packer stats $(DEMO)/caption_trees --plot $(DEMO)/caption_trees_stats.png
	$(VENV)/bin/packer inspect $(DEMO)/caption_trees --row 0 --mask $(DEMO)/caption_trees_mask.png
	$(VENV)/bin/packer build $(DEMO)/jsonl/coco_grounding.jsonl --output $(DEMO)/grounding \
		--profile qwen2-vl --max-length 4096 --overwrite
	$(VENV)/bin/packer stats $(DEMO)/grounding --plot $(DEMO)/grounding_stats.png
	$(VENV)/bin/packer verify $(DEMO)/caption_trees --input $(DEMO)/jsonl/coco_caption_trees.jsonl
	$(VENV)/bin/packer build $(DEMO)/jsonl/coco_video_trees.jsonl --output $(DEMO)/video_trees \
		--profile qwen2.5-vl --max-length 8192 --overwrite
	$(VENV)/bin/packer stats $(DEMO)/video_trees
	$(VENV)/bin/packer verify $(DEMO)/video_trees --input $(DEMO)/jsonl/coco_video_trees.jsonl
	$(VENV)/bin/packer build $(DEMO)/jsonl/coco_spoken_qa.jsonl --output $(DEMO)/spoken_qa \
		--profile $(AUDIO_PROFILE) --max-length 4096 --max-audio-tokens 1500 --overwrite
	$(VENV)/bin/packer stats $(DEMO)/spoken_qa --plot $(DEMO)/spoken_qa_stats.png
	$(VENV)/bin/packer verify $(DEMO)/spoken_qa --input $(DEMO)/jsonl/coco_spoken_qa.jsonl

# CI's command. It prints the 25 slowest tests, so a suite creeping toward CI's 30 minutes shows where.
test: setup
	HF_HUB_OFFLINE=1 PACKER_SHARED=$(SHARED) $(PY) -m pytest -q -n 2 --durations=25 $(PYTEST_ARGS)

# The edit loop: everything not marked `slow` (multi-process crash and Ray runs, real-model proofs, processor
# sweeps over every COCO image): ~9 min on a slow 2-core box (README). CI and `make test` run the whole suite.
test-fast: setup
	HF_HUB_OFFLINE=1 PACKER_SHARED=$(SHARED) $(PY) -m pytest -q -n 2 -m "not slow" $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check packer tests scripts

# The GPU proof on a CUDA node as it is (no venv, no network): its own python3 with torch, and the wheels that
# `make gpu-wheels` put in .gpu/ (fla-core + what packer needs that such an image lacks) installed --no-index
# into a temp dir. Kernels in bf16 against fp32, fla's varlen gated delta, the packed-vs-padded training step;
# one JSON summary. Without CUDA it says so and exits 0 (`python scripts/gpu_check.py --dry-run`: the same on CPU).
gpu-wheels:
	$(PYTHON) scripts/gpu_wheels.py --out .gpu --shared $(SHARED)/data --verify

gpu-check:
	PYTHONPATH=$(CURDIR) HF_HUB_OFFLINE=1 $(GPU_PYTHON) scripts/gpu_check.py --wheels .gpu/wheels --data .gpu/data --out .gpu/out

docs: setup
	$(PY) scripts/gen_cli_docs.py

clean:
	rm -rf $(VENV) $(DEMO) .pytest_cache
