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

# Optional: LeRobotDataset 0.6.1 as an oracle for tests/benchmarks, in its own Python 3.12 venv
# (it needs Python >= 3.12 and torch < 2.12, so it is never a dependency of this project).
LEROBOT_VENV ?= /tmp/lerobot-venv
lerobot-oracle:
	[ -x $(LEROBOT_VENV)/bin/python ] || python3.12 -m venv $(LEROBOT_VENV)
	$(LEROBOT_VENV)/bin/pip install -q 'lerobot[dataset]==0.6.1'

clean:
	rm -rf demo-out .pytest_cache
