# goinfer: the README's commands.  `make run` and `make test` do all the set-up on a fresh clone.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
MODEL ?= smollm2-135m
PROMPT ?= In two sentences, why does prefill speed matter for AI agents?

.PHONY: run test venv install install-test dev bench clean

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
	rm -rf build dist $(VENV) goinfer/_kernels/*.so
