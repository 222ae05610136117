"""The datakit commands off the data path; `datakit/cli.py` dispatches to them.

- info.py: `datakit info OUT`; summary.py: the rich tables of an index (convert and info print them)
- doctor/: `datakit doctor SRC`, audit a source without converting it (`python -m datakit.commands.doctor`)
- plan/: `datakit plan OUT`, what a target samples/s needs (bandwidth, cache, host-to-device bytes)
- bench_decoders/: `datakit bench-decoders`, PyAV vs Decord vs TorchCodec as training reads video
- demo.py: `datakit demo`, generate -> convert -> verify -> read back against PyAV
- flag_types.py: argparse types that refuse absurd values while the command line is parsed
"""
