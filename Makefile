# make demo: install, then generate a small LeRobot dataset (real AV1), convert, verify, summarise.
# make test: install, then run the whole test suite (slow/GPU tests skip cleanly).
VENV ?= .venv
STAMP := $(VENV)/.installed

.PHONY: demo test install bench clean

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

clean:
	rm -rf demo-out .pytest_cache
