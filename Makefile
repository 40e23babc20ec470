# Two commands on a fresh machine: `make train` and `make test`. Each sets itself up. `make drills` runs the
# end-to-end drills that `make test` leaves out (CI runs both).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONFIG ?= configs/default.yaml
ARGS ?=
# an index pip reads beside PyPI, for torch: PyPI's Linux torch is a CUDA build (several GB with its libraries);
# TORCH_INDEX=https://download.pytorch.org/whl/cpu installs the CPU build instead (a few hundred MB)
TORCH_INDEX ?=
# test processes (pytest-xdist): one per core, at most 4 (each holds torch and tiny models in memory)
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)

.PHONY: setup stockfish browser train test drills clean

$(STAMP): pyproject.toml constraints.txt
	@bash scripts/ensure_venv.sh $(PYTHON) $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) \
		-e ".[dev,report,lora,sweep,bench,hub,wandb]"
	touch $(STAMP)

setup: $(STAMP) stockfish

stockfish:
	@bash scripts/ensure_stockfish.sh

# Chromium, for the test that renders report.html (installed when root on Debian; otherwise a note).
browser:
	@bash scripts/ensure_chromium.sh

train: setup
	$(VENV)/bin/rookworld train --config $(CONFIG) $(ARGS)

test: setup browser
	@$(PY) -m pytest -q -n $(TEST_JOBS) --dist worksteal $(ARGS); rc=$$?; \
	if [ $$rc = 5 ]; then echo "error: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# the end-to-end drills: the kill drills (scripts/fault_drill.py --smoke) and the GPU scripts' --smoke runs
drills: setup
	@$(PY) -m pytest -q -n $(TEST_JOBS) --dist worksteal -m drill $(ARGS); rc=$$?; \
	if [ $$rc = 5 ]; then echo "error: pytest collected no drills" >&2; exit 1; fi; exit $$rc

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
