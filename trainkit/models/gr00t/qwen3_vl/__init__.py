"""GR00T N1.7's vision-language backbone, Qwen3-VL-2B (NVIDIA's Cosmos-Reason2-2B), in the order a
sample runs through it: config.py (the shapes, from a Qwen3-VL `config.json`), vision.py (the ViT
and its deepstack mergers), mrope.py (interleaved 3-D positions), text.py (the LLM layers),
backbone.py (`Qwen3VLBackbone`: the three together, as LeRobot 0.6.1 runs them). model.py of the
family runs the same parts with the ViT's blocks and the LLM layers as block lists."""
