#!/usr/bin/env bash
# Call B (either card, ~10 min; issue 39): GR00T with LeRobot's peer at 16 and 128, then the head on a cached backbone (apart)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whl/encode/*.whl && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/lrsite .whl/lerobot/*.whl && export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1; nvidia-smi --query-gpu=name,memory.total,memory.used,power.limit --format=csv > $OUT/card.csv; cat $OUT/card.csv; date -u
PYTHONPATH=$PWD:/tmp/site:/tmp/lrsite timeout 100 python3 bench/peers/peer_lerobot_gr00t.py --out $OUT/lerobot_gr00t16.json --settings bf16_autocast --batch 16 --steps 8 --skip 3 > $OUT/peer.log 2>&1; tail -2 $OUT/peer.log
PYTHONPATH=$PWD:/tmp/site:/tmp/lrsite timeout 100 python3 bench/peers/peer_lerobot_gr00t.py --out $OUT/lerobot_gr00t128.json --settings bf16_autocast --batch 128 --steps 8 --skip 3 >> $OUT/peer.log 2>&1; tail -2 $OUT/peer.log; date -u
timeout 200 python3 bench/gpu/gpu.py gr00t --out $OUT/g --budget-s 140 --only optimised_mbs16_graphs optimised_mbs256_fast > $OUT/g.log 2>&1; tail -3 $OUT/g.log; date -u
timeout 180 python3 bench/gpu/gpu.py gr00t --out $OUT/c --budget-s 120 --only cached_backbone_mbs256 > $OUT/c.log 2>&1; tail -3 $OUT/c.log; date -u
