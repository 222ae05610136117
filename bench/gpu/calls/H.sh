#!/usr/bin/env bash
# Call H (an H200, ~10 min; issues 40 and 41): Pi0.5 with LeRobot's peer and the probe, the full DreamZero 5b in a graph
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whl/encode/*.whl && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/lrsite .whl/lerobot/*.whl && export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1; nvidia-smi --query-gpu=name,memory.total,memory.used,power.limit --format=csv > $OUT/card.csv; cat $OUT/card.csv; date -u
PYTHONPATH=$PWD:/tmp/site:/tmp/lrsite timeout 120 python3 bench/peers/peer_lerobot_pi05.py --out $OUT/lerobot_pi05.json --batch 32 --steps 7 --skip 3 > $OUT/peer.log 2>&1; tail -3 $OUT/peer.log; date -u
timeout 300 python3 bench/gpu/gpu.py pi05 --out $OUT/pi --budget-s 240 --only optimised_first_writes probe optimised > $OUT/pi.log 2>&1; tail -4 $OUT/pi.log; date -u
timeout 170 python3 bench/gpu/gpu.py dreamzero --out $OUT/dz --budget-s 110 --only optimised_plain_graphs > $OUT/dz.log 2>&1; tail -4 $OUT/dz.log; date -u
