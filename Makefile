# make demo: install, then generate a small LeRobot dataset (real AV1), convert, verify, read back
# (`datakit demo`), then train pi05_tiny on the shards it wrote (`trainkit run`); fails unless the loss falls.
# make test: install, then run the whole test suite (slow/GPU tests skip cleanly) on TEST_PROCS processes
# (pytest-xdist, a test file per process at a time so module fixtures are built once; TEST_PROCS=0: one process).
# make test-fast: install, then a quick subset (FAST_TESTS: config, loader, shards, convert, verify, every preset,
# checkpoints and Ctrl-C; about 2 minutes on 2 busy cores), found by file name wherever tests/ keeps them.
VENV ?= .venv
STAMP := $(VENV)/.installed

.PHONY: demo demo-train test test-fast install bench clean lerobot-oracle

install: $(STAMP)

$(STAMP): pyproject.toml tools/install.sh tools/constraints.txt
	VENV=$(VENV) bash tools/install.sh
	touch $(STAMP)

DEMO_DIR ?= demo-out
DEMO_STEPS ?= 30
# trainkit's half of the demo: one CPU process, a fresh run each time (metrics.jsonl appends)
DEMO_TRAIN = trainkit/configs/pi05_tiny.toml --set data.shards=$(DEMO_DIR)/shards \
	--set output.dir=$(DEMO_DIR)/train --set train.steps=$(DEMO_STEPS) --set output.log_every=5 \
	--set output.progress=false --set output.resume=false --set data.num_workers=0

demo: $(STAMP)
	$(VENV)/bin/datakit demo --dir $(DEMO_DIR)
	$(MAKE) --no-print-directory demo-train

# trainkit's half alone (tests/docs/test_demo.py runs these lines): train on $(DEMO_DIR)/shards, check the loss fell
demo-train:
	rm -rf $(DEMO_DIR)/train
	$(VENV)/bin/trainkit run $(DEMO_TRAIN)
	$(VENV)/bin/python tools/demo_check.py $(DEMO_DIR)/train --steps $(DEMO_STEPS)

TEST_PROCS ?= 2
test: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest -q -n $(TEST_PROCS) --dist loadfile tests

FAST_TESTS = test_trainkit_config.py test_loader_sampler.py test_loader_dataset.py test_shard_writer.py \
	test_verify.py test_convert.py test_trainkit_presets.py test_trainkit_shipped_presets.py \
	test_trainkit_checkpoints.py test_trainkit_ctrl_c.py
test-fast: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest -q $(foreach f,$(FAST_TESTS),$(shell find tests -name $(f)))

bench: $(STAMP)
	$(VENV)/bin/python bench/data/bench_convert.py

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
	$(LEROBOT_VENV)/bin/pip install -q 'lerobot[dataset,pi]==0.6.1' 'diffusers==0.42.1' 'dm-tree==0.1.10' 'accelerate>=1.0'
	touch $(LEROBOT_VENV)/.ready

clean:
	rm -rf demo-out .pytest_cache
