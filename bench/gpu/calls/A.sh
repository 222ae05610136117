#!/usr/bin/env bash
# Call A (an H100, ~10 min; issues 40 and 41): Pi0.5 with LeRobot's peer (as shipped, first writes, 0.5 ms GIL switch), the graph-gradient test, DreamZero LoRA in graphs
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whl/encode/*.whl && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/lrsite .whl/lerobot/*.whl && export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1; nvidia-smi --query-gpu=name,memory.total,memory.used,power.limit --format=csv > $OUT/card.csv; cat $OUT/card.csv; date -u
PYTHONPATH=$PWD:/tmp/site:/tmp/lrsite timeout 110 python3 bench/peers/peer_lerobot_pi05.py --out $OUT/lerobot_pi05.json --batch 32 --steps 7 --skip 3 > $OUT/peer.log 2>&1; tail -3 $OUT/peer.log; date -u
timeout 260 python3 bench/gpu/gpu.py pi05 --out $OUT/pi --budget-s 200 --only optimised optimised_first_writes optimised_gil > $OUT/pi.log 2>&1; tail -4 $OUT/pi.log; date -u
timeout 30 python3 -m pytest -q -p no:cacheprovider tests/trainkit/parallel/test_graph_grads.py > $OUT/test.log 2>&1; tail -4 $OUT/test.log
timeout 180 python3 bench/gpu/gpu.py dreamzero --out $OUT/dz --budget-s 120 --only lora_plain_graphs lora_plain_graphs_gil > $OUT/dz.log 2>&1; tail -4 $OUT/dz.log; date -u
