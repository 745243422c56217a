# goinfer: the README's commands.  `make run` and `make test` do all the set-up on a fresh clone.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
MODEL ?= smollm2-135m
PROMPT ?= In two sentences, why does prefill speed matter for AI agents?

.PHONY: run test test-frameworks venv install install-test dev bench clean

$(VPY):
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip

venv: $(VPY)

install: $(VPY)
	$(VPY) -m pip install -q .

install-test: $(VPY)
	$(VPY) -m pip install -q ".[test]"

run: install
	$(VENV)/bin/goinfer pull $(MODEL)
	$(VENV)/bin/goinfer chat $(MODEL) --prompt "$(PROMPT)" --max-tokens 96

test: install-test
	cd tests && ../$(VPY) -m pytest -q -p no:cacheprovider .

# The agent-framework matrix (tests/frameworks): the frameworks' pins conflict, so two
# environments, each from its pinned requirements file, each with goinfer[server] from this tree
# (one wheel, built once); each runs its frameworks' tests against `goinfer serve`.
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
	rm -rf build/frameworks-wheel
	.venv-frameworks-openai3/bin/python -m pip wheel -q --no-deps -w build/frameworks-wheel .
	whl=$$(ls build/frameworks-wheel/goinfer-*.whl) && for v in openai3 openai2; do \
	  .venv-frameworks-$$v/bin/python -m pip install -q --force-reinstall --no-deps $$whl && \
	  .venv-frameworks-$$v/bin/python -m pip install -q "$$whl[server]" || exit 1; \
	done
	cd $(FW) && rc=0; \
	../../.venv-frameworks-openai3/bin/python -m pytest $(FW_OPENAI3) || rc=1; \
	../../.venv-frameworks-openai2/bin/python -m pytest $(FW_OPENAI2) || rc=1; \
	exit $$rc

bench: install
	$(VENV)/bin/goinfer bench $(MODEL)

# Developer loop: incremental in-tree build of the extensions (serialized by a lock) so that
# `PYTHONPATH=. python ...` runs the source tree.  Uses the interpreter given by PY.
dev:
	@mkdir -p build/dev
	flock build/dev/.lock sh -c '\
	  cmake -S . -B build/dev -G Ninja -DCMAKE_BUILD_TYPE=Release \
	    -DPython_EXECUTABLE=$$($(PY) -c "import sys; print(sys.executable)") >/dev/null && \
	  cmake --build build/dev && cp build/dev/*.so goinfer/_kernels/'

clean:
	rm -rf build dist $(VENV) .venv-frameworks-* goinfer/_kernels/*.so
