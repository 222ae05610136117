# make demo: install, then generate a small LeRobot dataset (real AV1), convert, verify, summarise.
# make test: install, then run the whole test suite (slow/GPU tests skip cleanly).
VENV ?= .venv
STAMP := $(VENV)/.installed

.PHONY: demo test install bench clean lerobot-oracle

install: $(STAMP)

$(STAMP): pyproject.toml tools/install.sh tools/constraints.txt
	VENV=$(VENV) bash tools/install.sh
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/datakit demo --dir demo-out

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest -q tests

bench: $(STAMP)
	$(VENV)/bin/python bench/bench_convert.py

# Optional: LeRobot 0.6.1 as an oracle for tests/benchmarks (LeRobotDataset for the loader interop,
# PI05Policy for the pi05 parity test, the GR00T head with diffusers + dm-tree), in its own Python
# 3.12 venv: it needs Python >= 3.12 and torch < 2.12, so it is never a dependency of this project.
# Tests skip cleanly without it: they need $(LEROBOT_VENV)/.ready, written once the install finished.
# PYTHON312: the first python3.12 that runs (a pyenv shim whose version is not selected does not).
LEROBOT_VENV ?= /tmp/lerobot-venv
PYTHON312 ?= $(firstword $(foreach p,python3.12 $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12),\
	$(shell $(p) -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1 && echo $(p))))
lerobot-oracle:
	@[ -n "$(PYTHON312)" ] || { echo "lerobot-oracle: no working python3.12 (set PYTHON312=...)" >&2; exit 2; }
	[ -x $(LEROBOT_VENV)/bin/python ] || $(PYTHON312) -m venv $(LEROBOT_VENV)
	rm -f $(LEROBOT_VENV)/.ready
	$(LEROBOT_VENV)/bin/pip install -q 'lerobot[dataset,pi]==0.6.1' 'diffusers==0.42.1' 'dm-tree==0.1.10'
	touch $(LEROBOT_VENV)/.ready

clean:
	rm -rf demo-out .pytest_cache
