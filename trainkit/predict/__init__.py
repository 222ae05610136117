"""`trainkit predict`: open-loop action error of a checkpoint on held-out episodes, the offline
check practitioners run before a robot rollout.

    trainkit predict runs/pi05 --shards out/shards                       # the run's validation episodes
    trainkit predict runs/pi05 --shards out/shards --episodes 0,3-5 --weights ema --out eval/
    trainkit predict exp/pi05_lerobot --config trainkit/configs/pi05_tiny.toml --shards out/shards

The family's flow-matching sampler (`Family.sampler`: Pi0.5 10 Euler steps from t = 1 to 0, as
openpi and LeRobot; GR00T 4 from t = 0 to 1; DreamZero 16) samples an action chunk every
`--every` frames of each episode from that frame's observation; the actions, unnormalised with the
statistics the model trained with, are compared with the recorded ones: MSE and MAE per episode and
per action channel, as a table, `predict.json` and `predict.png`.

Modules: source.py (the model and its statistics: a run or a checkpoint folder), chunks.py (the
trajectories), report.py (errors, table, JSON, plot), command.py (the order of it all).
The room's other offline pass of a model over shards: encode_backbone.py (`trainkit encode-backbone`,
a family's frozen front cached into a feature folder the head trains from).
"""
